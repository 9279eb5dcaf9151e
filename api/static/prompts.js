import { $, api, escapeHtml, fieldErrors, handleSubmit, header } from "./app.js";

header();
const dialog = $("#editor"), form = $("#prompt-form");
let editing = null;

$("#enable_quality_review").addEventListener("change", (event) => {
  $("#quality_review_rules").disabled = !event.target.checked;  // rules only with review on
});

function open(prompt) {
  editing = prompt ? prompt.id : null;
  $("#editor-title").textContent = prompt ? `Edit “${prompt.name}”` : "New system prompt";
  $("#name").value = prompt ? prompt.name : "";
  $("#system_prompt").value = prompt ? prompt.system_prompt : "";
  $("#enable_quality_review").checked = prompt ? prompt.enable_quality_review : false;
  $("#quality_review_rules").value = prompt ? prompt.quality_review_rules || "" : "";
  $("#quality_review_rules").disabled = !$("#enable_quality_review").checked;
  $("#max_cost_usd").value = prompt?.max_cost_usd ?? "";
  $("#max_tokens").value = prompt?.max_tokens ?? "";
  form.querySelectorAll(".error").forEach((e) => { e.textContent = ""; });
  dialog.showModal();
  $("#name").focus();
}

// Its sessions' tasks' default spend limit, as a badge says it ("" for none)
const limits = (p) => [p.max_cost_usd != null ? `$${p.max_cost_usd}` : "",
                       p.max_tokens != null ? `${p.max_tokens} tokens` : ""]
  .filter(Boolean).join(", ");
// A number field's value for the API: empty is null (no default limit)
const numberOrNull = (id) => ($(id).value === "" ? null : Number($(id).value));

async function load() {
  const prompts = await api("/prompts");
  $("#list").innerHTML = prompts.map((p) => `<div class="card" data-id="${p.id}">
    <strong>${escapeHtml(p.name)}</strong>
    ${p.enable_quality_review ? '<span class="badge">quality review on</span>' : ""}
    ${limits(p) ? `<span class="badge">limit ${escapeHtml(limits(p))}</span>` : ""}
    <p class="muted">${escapeHtml(p.system_prompt.slice(0, 200))}</p>
    <div class="row"><button type="button" class="secondary" data-edit="${p.id}">Edit</button>
    <button type="button" class="danger" data-delete="${p.id}">Delete</button></div></div>`)
    .join("") || "<p>No prompts yet.</p>";
  $("#list").querySelectorAll("[data-edit]").forEach((button) => button.addEventListener(
    "click", () => open(prompts.find((p) => p.id === Number(button.dataset.edit)))));
  $("#list").querySelectorAll("[data-delete]").forEach((button) => button.addEventListener(
    "click", async () => { await api(`/prompts/${button.dataset.delete}`, { method: "DELETE" });
                           load(); }));
}

handleSubmit(form, async () => {
  const body = { name: $("#name").value, system_prompt: $("#system_prompt").value,
                 enable_quality_review: $("#enable_quality_review").checked,
                 quality_review_rules: $("#quality_review_rules").value || null,
                 max_cost_usd: numberOrNull("#max_cost_usd"),
                 max_tokens: numberOrNull("#max_tokens") };
  try {
    await api(editing ? `/prompts/${editing}` : "/prompts",
              { method: editing ? "PATCH" : "POST", body: JSON.stringify(body) });
    dialog.close();
    load();
  } catch (error) {
    const errors = fieldErrors(error);
    form.querySelectorAll(".error").forEach((e) => { e.textContent = ""; });
    for (const [field, message] of Object.entries(errors)) {
      const slot = $(`#err-${field}`) || $("#err-_");
      slot.textContent = message;
    }
  }
});
$("#cancel").addEventListener("click", () => dialog.close());
$("#new-prompt").addEventListener("click", () => open(null));
$("#new-prompt").disabled = false;  // shipped disabled: nothing to open before this script
load();
