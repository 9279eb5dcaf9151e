import { $, api, escapeHtml, fieldErrors, handleSubmit, header } from "./app.js";

header();

// The form is handled before anything is fetched: a Start clicked while the prompts load
// must not fall through to the browser's own submit, which reloads the page and drops
// what was typed.
handleSubmit($("#task-form"), async () => {
  document.querySelectorAll(".error").forEach((e) => { e.textContent = ""; });
  const start = { approval_mode: $("#approval").value };
  if ($("#workspace").value) start.workspace = $("#workspace").value;
  if ($("#prompt").value) start.prompt_id = Number($("#prompt").value);
  if ($("#model").value) start.model = $("#model").value;
  try {
    const { session_id } = await api("/agent/interactive/start",
                                     { method: "POST", body: JSON.stringify(start) });
    const task = { session_id, task: $("#task").value };
    if ($("#review").value) task.enable_quality_review = $("#review").value === "on";
    if ($("#rules").value) task.quality_review_rules = $("#rules").value;
    const { task_id } = await api("/agent/interactive/task",
                                  { method: "POST", body: JSON.stringify(task) });
    location.href = `task.html?id=${encodeURIComponent(task_id)}`;
  } catch (error) {
    for (const [field, message] of Object.entries(fieldErrors(error))) {
      ($(`#err-${field}`) || $("#err-_")).textContent = message;
    }
  }
});

for (const prompt of await api("/prompts")) {
  $("#prompt").insertAdjacentHTML("beforeend",
    `<option value="${prompt.id}">${escapeHtml(prompt.name)}</option>`);
}
