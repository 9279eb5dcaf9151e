import { $, api, escapeHtml, header, streamEvents, verdict } from "./app.js";

header();
const taskId = new URLSearchParams(location.search).get("id");
$("#task-id").textContent = taskId;
const seenKey = `refloop-events-${taskId}`;
const pending = new Map();
let plan = null, step = null, completed = [];

function renderPlan() {
  if (!plan) return;
  $("#plan").innerHTML = plan.steps.map((s, i) => {
    const n = i + 1, cls = completed.includes(n) ? "done" : n === step ? "current" : "";
    return `<li class="${cls}" ${n === step ? 'aria-current="step"' : ""}>${escapeHtml(s.goal)}
      <span class="badge">${escapeHtml(s.tool)}</span></li>`;
  }).join("");
}

function renderApprovals() {
  $("#approvals").innerHTML = [...pending.values()].map((p) => `<div class="card fail">
    <strong>Approval needed:</strong> ${escapeHtml(p.tool)}
    <pre>${escapeHtml(JSON.stringify(p.args, null, 1).slice(0, 600))}</pre>
    <div class="row"><button type="button" data-approve="${p.call_id}">Approve</button>
    <button type="button" class="danger" data-reject="${p.call_id}">Reject</button></div></div>`)
    .join("");
  $("#approvals").querySelectorAll("button").forEach((button) => button.addEventListener(
    "click", async () => {
      const approved = "approve" in button.dataset;
      const call_id = button.dataset.approve || button.dataset.reject;
      await api(`/tasks/${taskId}/approvals`, { method: "POST",
        body: JSON.stringify({ call_id, approved }) });
    }));
}

function card(html, cls = "") {
  $("#events").insertAdjacentHTML("beforeend", `<div class="card ${cls}">${html}</div>`);
}

function output(text) {
  const body = escapeHtml(text || "");
  return (text || "").length > 300
    ? `<details><summary>output (${text.length} chars)</summary><pre>${body}</pre></details>`
    : body ? `<pre>${body}</pre>` : "";
}

function show(event) {
  const d = event.data;
  switch (event.type) {
    case "plan": plan = d; renderPlan(); break;
    case "step": step = d.step; completed = d.completed || []; renderPlan(); break;
    case "tool_call": card(`→ <strong>${escapeHtml(d.tool)}</strong>
      <span class="muted">${escapeHtml(JSON.stringify(d.args).slice(0, 160))}</span>`); break;
    case "tool_result": card(`← ${escapeHtml(d.tool)} ${d.ok ? "ok" :
      `<span class="error">${escapeHtml(d.error)}</span>`}${output(d.output)}`,
      d.ok ? "" : "fail"); break;
    case "quality_review": { const v = verdict(d);
      card(`<strong>Quality review: ${escapeHtml(d.file_path)} — ${v.label}</strong>
      <span class="badge">${escapeHtml(d.outcome)}</span>
      <p>${escapeHtml(d.summary)}</p><ul>${(d.reasons || []).map((r) =>
      `<li>${escapeHtml(r)}</li>`).join("")}</ul>`, `${v.cls} quality-review`); break; }
    case "reflection": card(`<strong>Reflection</strong> <span class="badge">${escapeHtml(
      d.trigger)}</span> ${escapeHtml(d.trigger === "completeness"
        ? `${d.is_complete ? "complete" : "incomplete"}: ${d.analysis}`
        : d.evidence || d.message || "")}`, "reflection"); break;
    case "intent": card(`Intent: <strong>${escapeHtml(d.intent || "unknown")}</strong>
      <span class="muted">${escapeHtml(d.reason || d.error || "")}</span>`); break;
    case "constraints": card(`Task type <strong>${escapeHtml(d.task_type)}</strong>;
      forbidden: ${escapeHtml((d.forbidden || []).join(", ") || "none")}`); break;
    case "summary": card(`<strong>Summary</strong> ${escapeHtml(d.summary || "")}`); break;
    case "reflection_exec": card(`Supplement run: <a href="task.html?id=${encodeURIComponent(
      d.child_workflow_id)}">${escapeHtml(d.child_workflow_id)}</a>
      (${d.succeeded}/${d.attempted} succeeded)`); break;
    case "approval_required": pending.set(d.call_id, d); renderApprovals(); break;
    case "approval_decided": pending.delete(d.call_id); renderApprovals();
      card(`Approval ${d.approved ? "granted" : "rejected"} for call ${escapeHtml(d.call_id)}`);
      break;
    case "completed": case "failed": finish(); break;
    case "lost": case "cancelled": case "incomplete":
      card(`<strong>${escapeHtml(event.type)}</strong> ${escapeHtml(d.error || "")}`, "fail");
      finish(); break;
    default: card(`<span class="muted">${escapeHtml(event.type)}</span>`);
  }
}

function showStatus(status) {  // any status, as the API says it
  $("#status").textContent = status;
  $("#cancel").hidden = !["queued", "running", "waiting_approval", "waiting_for_host"].includes(status);
}

async function finish() {
  const state = await api(`/tasks/${taskId}`);
  showStatus(state.status);
  const result = state.result;
  if (!result) return;
  $("#final").hidden = false;
  $("#answer").textContent = result.answer;
  const s = result.stats;
  const figures = { iterations: s.iterations, "model calls": s.llm_calls,
    tokens: s.usage.total_tokens, "reviews passed": s.reviews.passed,
    "reviews failed": s.reviews.failed };
  $("#stats").innerHTML = Object.entries(figures).map(([k, v]) =>
    `<div class="card"><div class="muted">${k}</div><strong data-stat="${k}">${v}</strong></div>`)
    .join("");
}

$("#cancel").addEventListener("click", () => api(`/tasks/${taskId}/cancel`, { method: "POST" }));

// Resume after a reload: replay what this tab saw, then continue after its last id.
const seen = JSON.parse(sessionStorage.getItem(seenKey) || "[]");
seen.forEach(show);
$("#status").textContent = "running";
try {
  await streamEvents(`/tasks/${taskId}/events`, seen.length ? seen[seen.length - 1].id : 0,
  (event) => {
    if (event.type === "status") { showStatus(event.data.status); return; }  // not an event
    seen.push(event); sessionStorage.setItem(seenKey, JSON.stringify(seen)); show(event); });
} catch (error) {
  if (error.status !== 401) throw error;  // 401: the sign-in form is showing
}
if ($("#final").hidden && !$("#signin")) finish();
