import { $, api, escapeHtml, header, streamEvents, verdict } from "./app.js";
import { describe, englishTask } from "./events.js";
import { moveBox, wire as wireMove } from "./move.js";

header();
const taskId = new URLSearchParams(location.search).get("id");
$("#task-id").textContent = taskId;
const seenKey = `refloop-events-${taskId}`;
const pending = new Map();
let plan = null, step = null, completed = [], ended = false;
let checkpoints = 0;  // the run's checkpoints so far: a step's number for rewind and fork

function renderPlan() {
  if (!plan) return;
  $("#plan").innerHTML = plan.steps.map((s, i) => {
    const n = i + 1, done = completed.includes(n), current = !ended && n === step;
    const cls = done ? "done" : current ? "current" : "";
    return `<li class="${cls}" ${current ? 'aria-current="step"' : ""}>${escapeHtml(s.goal)}
      <span class="badge">${escapeHtml(s.tool)}</span>${done ? ' <span class="muted">done</span>' : ""}</li>`;
  }).join("");
}

// A tool's arguments as content: strings shown as text (their lines as lines), the rest
// as JSON.
export function argumentsHtml(args) {
  const entries = Object.entries(args || {});
  if (!entries.length) return '<p class="muted">no arguments</p>';
  return `<dl class="facts">${entries.map(([key, value]) => {
    const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    const shown = text.length > 4000 ? `${text.slice(0, 4000)}\n… (${text.length} characters)` : text;
    return `<dt>${escapeHtml(key)}</dt><dd>${text.includes("\n") || text.length > 80
      ? `<pre>${escapeHtml(shown)}</pre>` : `<code>${escapeHtml(shown)}</code>`}</dd>`;
  }).join("")}</dl>`;
}

function renderApprovals() {
  $("#approvals").innerHTML = [...pending.values()].map((p) => `<div class="card fail approval">
    <strong>Approval needed:</strong> ${escapeHtml(p.tool)}
    ${argumentsHtml(p.args)}
    <div class="row"><button type="button" data-approve="${escapeHtml(p.call_id)}">Approve</button>
    <button type="button" class="danger" data-reject="${escapeHtml(p.call_id)}">Reject</button></div></div>`)
    .join("");
  $("#approvals").querySelectorAll("button").forEach((button) => button.addEventListener(
    "click", async () => {
      const approved = "approve" in button.dataset;
      const call_id = button.dataset.approve || button.dataset.reject;
      await api(`/tasks/${taskId}/approvals`, { method: "POST",
        body: JSON.stringify({ call_id, approved }) });
    }));
  if (pending.size && location.hash === "#approvals") $("#approvals").scrollIntoView();
}

function card(type, html, cls = "") {
  $("#events").insertAdjacentHTML("beforeend",
    `<div class="card event ${cls}" data-event="${escapeHtml(type)}">${html}</div>`);
}

function show(event) {
  const d = event.data || {};
  switch (event.type) {
    case "plan": plan = d; renderPlan(); break;
    case "step": step = d.step; completed = d.completed || []; renderPlan(); break;
    case "approval_required": pending.set(d.call_id, d); renderApprovals(); break;
    case "approval_decided": pending.delete(d.call_id); renderApprovals(); break;
    case "waiting_for_model": showStatus("waiting_for_model"); break;
    case "model_back": showStatus("running"); break;
    case "waiting_for_host": showStatus("waiting_for_host"); break;
    case "host_back": case "moved_to_host": showStatus("running"); break;
    case "rewind": checkpoints = d.step; break;  // the run goes on from that step
    default: break;
  }
  const shown = describe(event, { verdict });
  if (shown) card(event.type, shown.html, shown.cls);
  if (event.type === "tool_result" && d.checkpoint) checkpointActions(++checkpoints, d);
  if (event.type === "reflection_exec") children().catch(() => {});
  if (["completed", "failed", "lost", "cancelled", "incomplete"].includes(event.type)) finish();
}

// "Rewind to here" (a running task) and "fork from here" under a call that took a
// checkpoint; each asks first, in a dialog that names the step and what will happen.
function checkpointActions(n, d) {
  $("#events").lastElementChild.insertAdjacentHTML("beforeend", `<div class="row checkpoint-actions">
    <button type="button" class="secondary" data-rewind="${n}" ${ended ? "hidden" : ""}>Rewind to here</button>
    <button type="button" class="secondary" data-fork="${n}">Fork from here</button></div>`);
  const actions = $("#events").lastElementChild.querySelector(".checkpoint-actions");
  actions.querySelector("[data-rewind]").addEventListener("click", () => confirmBranch("rewind", n, d));
  actions.querySelector("[data-fork]").addEventListener("click", () => confirmBranch("fork", n, d));
}

function confirmBranch(kind, n, d) {
  const dialog = $("#branch-dialog"), checkpoint = String(d.checkpoint).slice(0, 12);
  $("#branch-title").textContent = kind === "rewind" ? `Rewind to step ${n}?` : `Fork from step ${n}?`;
  $("#branch-what").textContent = kind === "rewind"
    ? `The workspace is put back as it was after step ${n} (${d.tool}, checkpoint ${checkpoint}) `
      + "and the task goes on from there: the later steps and their changes are undone. "
      + "Their cost stays in the task's stats, marked rewound."
    : `A new task starts in a new workspace holding the files as they were after step ${n} `
      + `(${d.tool}, checkpoint ${checkpoint}), with this task's plan and conversation up to there. `
      + "This task and its workspace are left as they are.";
  $("#branch-instruction-label").hidden = kind !== "fork";
  $("#branch-instruction").value = "";
  $("#branch-error").hidden = true;
  dialog.dataset.kind = kind; dialog.dataset.step = String(n);
  dialog.showModal();
}

$("#branch-form").addEventListener("submit", async (event) => {
  const dialog = $("#branch-dialog");
  if (event.submitter && event.submitter.value !== "confirm") return;  // cancelled: nothing sent
  event.preventDefault();
  const kind = dialog.dataset.kind, n = Number(dialog.dataset.step);
  const instruction = $("#branch-instruction").value.trim();
  const body = kind === "rewind" ? { to_step: n }
    : { at_step: n, ...(instruction ? { task: instruction } : {}) };
  try {
    const done = await api(`/tasks/${taskId}/${kind}`, { method: "POST", body: JSON.stringify(body) });
    dialog.close();
    if (kind === "fork") location.href = `task.html?id=${encodeURIComponent(done.task_id)}`;
  } catch (error) {
    const detail = error.body && error.body.detail;
    $("#branch-error").textContent = typeof detail === "string" ? detail
      : `${kind} failed (HTTP ${error.status || "?"})`;
    $("#branch-error").hidden = false;
  }
});

function showStatus(status) {  // any status, as the API says it
  $("#status").textContent = status;
  const open = ["queued", "running", "waiting_approval", "waiting_for_host",
    "waiting_for_model"].includes(status);
  $("#cancel").hidden = !open;
  // Only a running task can be rewound (an ended one can be forked)
  document.querySelectorAll("[data-rewind]").forEach((button) => { button.hidden = !open; });
  moveBox(taskId, status).catch(() => {});
}

async function facts() {
  const state = await api(`/tasks/${taskId}`);
  $("#task-text").textContent = englishTask(state.task || "");
  const parts = [state.kind && state.kind.replaceAll("_", " "),
    state.host && `host ${state.host}`, state.model && `model ${state.model}`];
  const parent = /^(.+)-supplement-\d+$/.exec(taskId);
  const session = state.session_id ? ` · session <a href="index.html?session_id=${
    encodeURIComponent(state.session_id)}">${escapeHtml(state.session_id)}</a>` : "";
  $("#task-facts").innerHTML = parts.filter(Boolean).map(escapeHtml).join(" · ") + session
    + (parent ? ` · supplement of <a href="task.html?id=${encodeURIComponent(parent[1])}">${
      escapeHtml(parent[1])}</a>` : "")
    + (state.forked_from ? ` · forked from <a href="task.html?id=${encodeURIComponent(
      state.forked_from.task_id)}">${escapeHtml(state.forked_from.task_id)}</a> at step ${
      escapeHtml(state.forked_from.step)}` : "")
    + ((state.forks || []).length ? ` · forks: ${state.forks.map((f) => `<a href="task.html?id=${
      encodeURIComponent(f.task_id)}">${escapeHtml(f.task_id)}</a> (step ${escapeHtml(f.step)})`).join(", ")}` : "")
    + (state.web_ui ? ` · <a href="${escapeHtml(state.web_ui)}" target="_blank" rel="noopener">history in the Temporal Web UI</a>` : "");
  return state;
}

// This task's children: the supplement runs its completeness check started.
async function children() {
  const found = (await api(`/tasks?q=${encodeURIComponent(taskId)}`))
    .filter((t) => t.task_id.startsWith(`${taskId}-supplement-`));
  $("#children").hidden = !found.length;
  $("#child-list").innerHTML = found.map((t) => `<li><a href="task.html?id=${
    encodeURIComponent(t.task_id)}">${escapeHtml(t.task_id)}</a> <span class="status">${
    escapeHtml(t.status)}</span></li>`).join("");
}

async function finish() {
  ended = true; renderPlan();
  children().catch(() => {});
  const state = await api(`/tasks/${taskId}`);
  showStatus(state.status);
  const result = state.result;
  if (!result) return;
  completed = result.completed_steps || completed; renderPlan();
  $("#final").hidden = false;
  $("#answer").textContent = result.answer;
  const s = result.stats;
  const figures = { iterations: s.iterations, "model calls": s.llm_calls,
    tokens: s.usage.total_tokens, "reviews passed": s.reviews.passed,
    "reviews failed": s.reviews.failed, "waited for the model (s)": Math.round(s.model_wait_s || 0),
    ...(s.rewound_usage && s.rewound_usage.total_tokens
      ? { "tokens of rewound steps (in the total)": s.rewound_usage.total_tokens } : {}) };
  $("#stats").innerHTML = Object.entries(figures).map(([k, v]) =>
    `<div class="card"><div class="muted">${k}</div><strong data-stat="${k}">${v}</strong></div>`)
    .join("");
}

$("#cancel").addEventListener("click", () => api(`/tasks/${taskId}/cancel`, { method: "POST" }));
wireMove(taskId);

// Resume after a reload: replay what this tab saw, then continue after its last id.
const seen = JSON.parse(sessionStorage.getItem(seenKey) || "[]");
seen.forEach(show);
$("#status").textContent = "running";
facts().then((state) => { if (state.status === "waiting_for_host") showStatus(state.status); })
  .catch(() => {});
try {
  await streamEvents(`/tasks/${taskId}/events`, seen.length ? seen[seen.length - 1].id : 0,
  (event) => {
    if (event.type === "status") { showStatus(event.data.status); return; }  // not an event
    seen.push(event); sessionStorage.setItem(seenKey, JSON.stringify(seen)); show(event); });
} catch (error) {
  if (error.status !== 401) throw error;  // 401: the sign-in form is showing
}
if ($("#final").hidden && !$("#signin")) finish();
