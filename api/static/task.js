import { $, api, escapeHtml, header, streamEvents, verdict } from "./app.js";
import { diffDetails, runPoints } from "./changes.js";
import { describe, englishTask } from "./events.js";
import { budgetBox, wire as wireBudget } from "./budget.js";
import { moveBox, wire as wireMove } from "./move.js";

header();
const taskId = new URLSearchParams(location.search).get("id");
$("#task-id").textContent = taskId;
const seenKey = `refloop-events-${taskId}`;
const OPEN = ["queued", "running", "waiting_approval", "waiting_for_host", "waiting_for_model",
  "waiting_for_budget"];
const FINAL = ["completed", "failed", "lost", "cancelled", "incomplete"];
const POLL_MS = 5000;
const pending = new Map();  // call id -> its approval card
let plan = null, step = null, completed = [], ended = false, status = null;
let calls = {};  // iteration -> the tool calls seen in it, in order (a call's index)
let lastCheckpoint = null;  // the workspace's latest checkpoint this page knows of
let points = null;  // the current run's checkpoints, as the API numbers them

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

// One card per waiting call, kept while others come and go (a reason being typed stays).
function addApproval(d) {
  if (ended || pending.has(d.call_id)) return;
  const box = document.createElement("div");
  const field = `reject-reason-${pending.size}-${d.call_id.replace(/[^\w-]/g, "_")}`;
  box.className = "card fail approval";
  box.innerHTML = `<strong>Approval needed:</strong> ${escapeHtml(d.tool)}
    <span class="muted">(call ${escapeHtml(d.call_id)})</span>${argumentsHtml(d.args)}${
  d.expires_at ? `<p class="muted expires">Unanswered by ${escapeHtml(new Date(d.expires_at)
    .toLocaleString())}, the task ends incomplete.</p>` : ""}
    <details class="edit-arguments"><summary>Edit the arguments before approving</summary>
    <label for="${field}-args">The call's arguments, as JSON (checked as the tool checks the
    model's own)</label>
    <textarea id="${field}-args" class="edited-arguments" rows="8" spellcheck="false"></textarea>
    <div class="row"><button type="button" data-approve-edited>Approve with these arguments</button></div>
    </details>
    <label for="${field}">Reason, if you reject it (the model reads it)</label>
    <textarea id="${field}" class="reject-reason" rows="2" maxlength="10000"></textarea>
    <div class="row"><button type="button" data-approve>Approve</button>
    <button type="button" class="danger" data-reject>Reject</button></div>
    <p class="error" role="alert" hidden></p>`;
  const editBox = box.querySelector(".edited-arguments");
  editBox.value = JSON.stringify(d.args || {}, null, 2);
  editBox.addEventListener("input", () => { box.querySelector(".error").hidden = true; });
  box.querySelectorAll("button").forEach((button) => button.addEventListener("click", () =>
    decide(box, d.call_id, !("reject" in button.dataset), "approveEdited" in button.dataset)));
  pending.set(d.call_id, box);
  $("#approvals").append(box);
  if (location.hash === "#approvals") $("#approvals").scrollIntoView();
}

// Approve (as asked, or with the edited arguments) or reject; a refusal shows on the card,
// in the API's words (an edit the tool would refuse says why), and the call still waits.
async function decide(box, callId, approved, edited = false) {
  const comment = box.querySelector(".reject-reason").value.trim();
  const error = box.querySelector(".error");
  let args = null;
  if (edited) {
    try {
      args = JSON.parse(box.querySelector(".edited-arguments").value);
    } catch (failure) {
      error.textContent = `The arguments are not JSON: ${failure.message}`;
      error.hidden = false;
      return;
    }
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      error.textContent = "The arguments are a JSON object: {\"name\": value, ...}";
      error.hidden = false;
      return;
    }
  }
  error.hidden = true;
  box.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  try {
    await api(`/tasks/${taskId}/approvals`, { method: "POST", body: JSON.stringify(
      { call_id: callId, approved, ...(!approved && comment ? { comment } : {}),
        ...(args ? { arguments: args } : {}) }) });
  } catch (failure) {
    const detail = failure.body && failure.body.detail;
    error.textContent = typeof detail === "string" ? detail : `not sent (${failure.message})`;
    error.hidden = false;
    box.querySelectorAll("button").forEach((b) => { b.disabled = false; });
  }
}

function dropApproval(callId) {
  const box = pending.get(callId);
  if (box) box.remove();
  pending.delete(callId);
}

function card(type, html, cls = "") {
  $("#events").insertAdjacentHTML("beforeend",
    `<div class="card event ${cls}" data-event="${escapeHtml(type)}">${html}</div>`);
  return $("#events").lastElementChild;
}

function show(event) {
  const d = event.data || {};
  switch (event.type) {
    case "plan": plan = d; renderPlan(); break;
    case "step": step = d.step; completed = d.completed || []; renderPlan(); break;
    case "tool_call": (calls[d.iteration] ||= []).push(d); break;
    case "approval_required": addApproval(d); break;
    case "approval_decided": dropApproval(d.call_id); break;
    case "waiting_for_model": showStatus("waiting_for_model"); break;
    case "model_back": showStatus("running"); break;
    case "waiting_for_host": showStatus("waiting_for_host"); break;
    case "host_back": case "moved_to_host": showStatus("running"); break;
    case "waiting_for_budget": showStatus("waiting_for_budget"); break;
    case "budget_resumed": showStatus("running"); break;
    default: break;
  }
  const shown = describe(event, { verdict });
  const added = shown ? card(event.type, shown.html, shown.cls) : null;
  if (event.type === "tool_result" && d.checkpoint && added) checkpointCard(added, d);
  if (["workspace_restored", "forked_from"].includes(event.type) && d.checkpoint) {
    lastCheckpoint = d.checkpoint;
  }
  if (event.type === "rewound") {  // the calls waiting then were taken back
    lastCheckpoint = d.checkpoint;
    pending.forEach((_, callId) => dropApproval(callId));
  }
  if (["rewound", "workspace_restored", "continued_as_new"].includes(event.type)) refreshPoints();
  if (event.type === "reflection_exec") children().catch(() => {});
  if (FINAL.includes(event.type)) finish();
}

// A call that took a checkpoint: what it changed (against the checkpoint before it), and
// the rewind and fork points drawn once the API has said which checkpoints it takes.
function checkpointCard(element, d) {
  const same = calls[d.iteration] || [];
  const index = Math.max(0, same.length - 1);
  const call = same[index] || { tool: d.tool, args: {} };
  const base = lastCheckpoint;
  lastCheckpoint = d.checkpoint;
  Object.assign(element.dataset, { call: `${d.iteration}.${index}`, checkpoint: d.checkpoint,
    planStep: step ?? "", target: target(call) });
  element.append(diffDetails(taskId, "Changes", () => ({ checkpoint: d.checkpoint,
    ...(base ? { base } : {}) })));
  element.insertAdjacentHTML("beforeend", '<div class="row checkpoint-actions"></div>');
  $("#task-changes-card").hidden = false;
  drawPoint(element);
  refreshPoints();
}

// What a call worked on, in a few words: "write_file report.md", "run_cmd make test".
function target(call) {
  const args = call.args || {};
  const what = args.path ?? args.file_path ?? args.command ?? args.pattern ?? "";
  const text = String(what).split("\n")[0];
  return `${call.tool}${text ? ` ${text.length > 60 ? `${text.slice(0, 59)}…` : text}` : ""}`;
}

function pointName(element, n) {
  const where = element.dataset.planStep ? `after plan step ${element.dataset.planStep}, `
    : "after ";
  return `checkpoint ${n} (${where}call ${element.dataset.call}: ${element.dataset.target})`;
}

function drawPoint(element) {
  const actions = element.querySelector(".checkpoint-actions");
  const n = points && points.get(`${element.dataset.call}|${element.dataset.checkpoint}`);
  if (!n) {
    actions.innerHTML = points ? '<span class="muted">Not a checkpoint of the current run: '
      + "rewind and fork are offered for those only.</span>" : "";
    return;
  }
  actions.innerHTML = `<span class="muted">Checkpoint ${n}</span>
    ${ended || !OPEN.includes(status) ? "" : '<button type="button" class="secondary" data-rewind>Rewind to here</button>'}
    <button type="button" class="secondary" data-fork>Fork from here</button>`;
  actions.querySelectorAll("button").forEach((button) => button.addEventListener("click",
    () => confirmBranch("rewind" in button.dataset ? "rewind" : "fork", n, element)));
}

let asking = null;
// The API's numbering, asked again (at most one request at a time) when it may have changed.
function refreshPoints() {
  if (asking) { asking.again = true; return; }
  asking = { again: false };
  setTimeout(async () => {
    points = await runPoints(taskId);
    document.querySelectorAll("#events [data-checkpoint]").forEach(drawPoint);
    const again = asking.again;
    asking = null;
    if (again) refreshPoints();
  }, 200);
}

function confirmBranch(kind, n, element) {
  const name = pointName(element, n), checkpoint = element.dataset.checkpoint.slice(0, 12);
  $("#branch-title").textContent = kind === "rewind" ? `Rewind to checkpoint ${n}?`
    : `Fork from checkpoint ${n}?`;
  $("#branch-what").textContent = kind === "rewind"
    ? `The workspace is put back as it was at ${name}, checkpoint id ${checkpoint}, `
      + "and the task goes on from there: the later calls and their changes are undone. "
      + "Their cost stays in the task's stats, marked rewound."
    : `A new task starts in a new workspace holding the files as they were at ${name}, `
      + `checkpoint id ${checkpoint}, with this task's plan and conversation up to there. `
      + "This task and its workspace are left as they are.";
  $("#branch-instruction-label").hidden = kind !== "fork";  // a rewind takes none
  $("#branch-instruction").value = "";
  $("#branch-error").hidden = true;
  const dialog = $("#branch-dialog");
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
    else refreshPoints();  // the task's events go on: a "rewound" card follows
  } catch (error) {
    const detail = error.body && error.body.detail;
    $("#branch-error").textContent = typeof detail === "string" ? detail
      : `${kind} failed (HTTP ${error.status || "?"})`;
    $("#branch-error").hidden = false;
  }
});

function showStatus(now) {  // any status, as the API says it
  status = now;
  $("#status").textContent = now;
  const open = !ended && OPEN.includes(now);
  $("#cancel").hidden = !open;
  if (!open) $("#cancel-confirm").hidden = true;
  $("#rerun").hidden = open || !FINAL.includes(now);
  if (!open) { pending.forEach((_, callId) => dropApproval(callId)); }  // nothing to decide
  // Only a running task can be rewound (an ended one can be forked)
  document.querySelectorAll("#events [data-checkpoint]").forEach(drawPoint);
  moveBox(taskId, now).catch(() => {});
  budgetBox(taskId, now).catch(() => {});
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
      state.forked_from.task_id)}">${escapeHtml(state.forked_from.task_id)}</a> at checkpoint ${
      escapeHtml(state.forked_from.step)}` : "")
    + ((state.forks || []).length ? ` · forks: ${state.forks.map((f) => `<a href="task.html?id=${
      encodeURIComponent(f.task_id)}">${escapeHtml(f.task_id)}</a> (checkpoint ${escapeHtml(f.step)})`).join(", ")}` : "")
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
  pending.forEach((_, callId) => dropApproval(callId));  // an ended task decides nothing
  $("#cancel").hidden = true; $("#cancel-confirm").hidden = true;
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
    tokens: s.usage.total_tokens, "cost (USD)": (s.usage.cost_usd || 0).toFixed(4),
    ...(s.usage.unpriced_calls ? { "model calls without a price": s.usage.unpriced_calls } : {}),
    "reviews passed": s.reviews.passed,
    "reviews failed": s.reviews.failed, "waited for the model (s)": Math.round(s.model_wait_s || 0),
    ...(s.rewound_usage && s.rewound_usage.total_tokens
      ? { "tokens of rewound steps (in the total)": s.rewound_usage.total_tokens } : {}) };
  $("#stats").innerHTML = Object.entries(figures).map(([k, v]) =>
    `<div class="card"><div class="muted">${k}</div><strong data-stat="${k}">${v}</strong></div>`)
    .join("");
}

// Cancel asks first; nothing is sent until it is confirmed.
$("#cancel").addEventListener("click", () => {
  $("#cancel-error").hidden = true;
  $("#cancel-confirm").hidden = false;
  $("#cancel-no").focus();
});
$("#cancel-no").addEventListener("click", () => { $("#cancel-confirm").hidden = true; });
$("#cancel-yes").addEventListener("click", async () => {
  try {
    await api(`/tasks/${taskId}/cancel`, { method: "POST" });
    $("#cancel-confirm").hidden = true;
    $("#status").textContent = "cancelling";
  } catch (error) {
    const detail = error.body && error.body.detail;
    $("#cancel-error").textContent = typeof detail === "string" ? detail : error.message;
    $("#cancel-error").hidden = false;
  }
});
$("#rerun").addEventListener("click", async () => {
  try {
    const started = await api(`/tasks/${taskId}/rerun`, { method: "POST" });
    location.href = `task.html?id=${encodeURIComponent(started.task_id)}`;
  } catch (error) {
    const detail = error.body && error.body.detail;
    $("#rerun-error").textContent = `Not started: ${typeof detail === "string" ? detail
      : error.message}`;
  }
});
$("#task-changes").replaceWith(diffDetails(taskId, "Every change the task made",
  () => ({ since_start: "true", ...(lastCheckpoint ? { checkpoint: lastCheckpoint } : {}) })));
wireMove(taskId);
wireBudget(taskId);

let seen = JSON.parse(sessionStorage.getItem(seenKey) || "[]");
let stream = null;

// The events: those this tab saw, then the stream after its last id. `afresh`: a rewound
// run numbers its events again from the reset point, so they are all read again.
async function follow(afresh = false) {
  if (stream) stream.abort();
  const mine = stream = new AbortController();
  if (afresh) {
    seen = []; sessionStorage.removeItem(seenKey);
    $("#events").innerHTML = ""; pending.forEach((_, callId) => dropApproval(callId));
    plan = null; step = null; completed = []; ended = false; calls = {}; lastCheckpoint = null;
    $("#final").hidden = true;
  }
  seen.forEach(show);
  try {
    await streamEvents(`/tasks/${taskId}/events`, seen.length ? seen[seen.length - 1].id : 0,
      (event) => {
        if (event.type === "status") { showStatus(event.data.status); return; }  // not an event
        seen.push(event); sessionStorage.setItem(seenKey, JSON.stringify(seen)); show(event);
      }, mine.signal);
  } catch (error) {
    if (mine.signal.aborted) return;  // followed afresh
    if (error.status !== 401) throw error;  // 401: the sign-in form is showing
  }
  if (stream === mine && $("#final").hidden && !$("#signin")) finish();
}

// A rewind from elsewhere (the CLI, another tab) resets the run: its events count fewer
// than this page has seen, so they are read again.
async function watch() {
  if (ended) return;
  try {
    const state = await api(`/tasks/${taskId}`);
    const last = seen.length ? seen[seen.length - 1].id : 0;
    if (state.progress && state.progress.event_count < last) follow(true);
  } catch (error) { /* the stream says what is wrong */ }
  setTimeout(watch, POLL_MS);
}

$("#status").textContent = "…";
facts().then((state) => { if (!ended) showStatus(state.status); }).catch(() => {});
follow();
setTimeout(watch, POLL_MS);
