// The front page: every task, newest first, live, filterable; on top an inbox of the tasks
// waiting for a person (an approval, or a host to move them to). Polled each second while
// a task runs (a wait may begin at any moment) and backing off to 10 s while nothing runs
// and nothing changes; a hidden tab asks nothing and refreshes when shown again. Without
// filters one request serves both the list and the inbox.
import { $, api, escapeHtml, handleSubmit, header } from "./app.js";
import { englishTask } from "./events.js";

header();
// Every status the API tells today; any other it tells later is shown as it comes.
const STATUSES = ["queued", "running", "waiting_approval", "waiting_for_host",
  "waiting_for_model", "waiting_for_budget", "completed", "incomplete", "failed", "cancelled", "lost"];
const FILTERS = { status: "#f-status", kind: "#f-kind", host: "#f-host", model: "#f-model",
                  session_id: "#f-session", q: "#f-q" };
const POLL_MS = 1000, IDLE_MAX_MS = 10000, LIMIT = 100;  // LIMIT: the API's default
const WAITING = ["waiting_approval", "waiting_for_host", "waiting_for_budget"];
const RUNNING = ["queued", "running", "waiting_for_model"];

function addStatusOption(status) {
  const select = $("#f-status");
  if ([...select.options].some((o) => o.value === status)) return;
  const option = document.createElement("option");
  option.value = status; option.textContent = status.replaceAll("_", " ");
  select.append(option);
}
STATUSES.forEach(addStatusOption);

const params = new URLSearchParams(location.search);
for (const [name, selector] of Object.entries(FILTERS)) {
  const value = params.get(name);
  if (value && name === "status") addStatusOption(value);
  if (value) $(selector).value = value;
}

function query() {
  const out = new URLSearchParams();
  for (const [name, selector] of Object.entries(FILTERS)) {
    const value = $(selector).value.trim();
    if (value) out.set(name, value);
  }
  return out;
}

export function statusClass(status) {
  if (["completed"].includes(status)) return "st-ok";
  if (["failed", "lost", "cancelled", "incomplete"].includes(status)) return "st-bad";
  if (status.startsWith("waiting")) return "st-wait";
  if (["queued", "running"].includes(status)) return "st-run";
  return "st-other";  // a status this page does not know yet: shown as the API says it
}

function duration(task) {
  const start = Date.parse(task.created_at);
  const end = task.finished_at ? Date.parse(task.finished_at) : Date.now();
  const seconds = task.duration_s ?? Math.max(0, (end - start) / 1000);
  return durationText(seconds);
}

// Rounded once, then split: 719.6 s reads "12 min 0 s", never "11 min 60 s".
export function durationText(seconds) {
  if (seconds < 9.95) return `${seconds.toFixed(1)} s`;
  if (seconds < 59.5) return `${Math.round(seconds)} s`;
  if (seconds < 3570) {
    const whole = Math.round(seconds);
    return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  }
  const minutes = Math.round(seconds / 60);
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function started(task) {
  const when = new Date(task.created_at);
  const today = when.toDateString() === new Date().toDateString();
  return `<time datetime="${escapeHtml(task.created_at)}" title="${escapeHtml(when.toISOString())}">${
    escapeHtml(today ? when.toLocaleTimeString() : when.toLocaleString())}</time>`;
}

function taskLink(task, text) {
  return `<a href="task.html?id=${encodeURIComponent(task.task_id)}">${escapeHtml(text)}</a>`;
}

function row(task) {
  const text = englishTask(task.task || task.task_id);
  const short = text.length > 140 ? `${text.slice(0, 139)}…` : text;
  const web = task.web_ui ? ` · <a href="${escapeHtml(task.web_ui)}" target="_blank"
    rel="noopener">Web UI</a>` : "";
  return `<tr data-task="${escapeHtml(task.task_id)}" data-status="${escapeHtml(task.status)}">
    <td><span class="status ${statusClass(task.status)}">${escapeHtml(task.status)}</span>
      ${task.from_database ? '<span class="muted" title="Temporal did not answer in time">(stored)</span>' : ""}</td>
    <td>${taskLink(task, short)}<div class="muted">${escapeHtml(task.task_id)}</div></td>
    <td>${escapeHtml((task.kind || "").replaceAll("_", " "))}</td>
    <td>${escapeHtml(task.host || "—")}</td><td>${escapeHtml(task.model || "—")}</td>
    <td class="num">${task.tokens ?? "—"}${task.cost_usd ? `<div class="muted">$${
      task.cost_usd.toFixed(4)}</div>` : ""}</td><td>${started(task)}</td>
    <td class="num">${duration(task)}</td><td>${taskLink(task, "Open")}${web}</td></tr>`;
}

function inbox(waiting) {
  const approvals = waiting.filter((t) => t.status === "waiting_approval");
  const hosts = waiting.filter((t) => t.status === "waiting_for_host");
  const budgets = waiting.filter((t) => t.status === "waiting_for_budget");
  $("#inbox-counts").textContent = `${approvals.length} waiting for approval · ${
    hosts.length} waiting for a host${budgets.length ? ` · ${budgets.length} waiting for budget`
    : ""}`;
  $("#inbox").classList.toggle("attention", waiting.length > 0);
  const items = [
    ...approvals.map((t) => `<li class="inbox-approval">${taskLink(t, englishTask(t.task || t.task_id))}
      <a class="button" href="task.html?id=${encodeURIComponent(t.task_id)}#approvals">Open approval</a></li>`),
    ...hosts.map((t) => `<li class="inbox-host">${taskLink(t, englishTask(t.task || t.task_id))}
      <a class="button" href="task.html?id=${encodeURIComponent(t.task_id)}#move">Move…</a>
      <span class="muted">waits for host ${escapeHtml(t.host || "?")}: start its worker,
      or move the task</span></li>`),
    ...budgets.map((t) => `<li class="inbox-budget">${taskLink(t, englishTask(t.task || t.task_id))}
      <a class="button" href="task.html?id=${encodeURIComponent(t.task_id)}#budget">Raise limit…</a>
      <span class="muted">spent $${(t.cost_usd || 0).toFixed(4)} of its limit</span></li>`)];
  $("#inbox-items").innerHTML = items.join("") || '<li class="muted">Nothing waits for you.</li>';
}

let busy = false, again = false, full = false, delay = POLL_MS, timer = null, last = "";

// The list and the inbox; whether anything changed since the last answer, and whether a
// task runs. Unfiltered, a list shorter than the limit holds every waiting task.
async function refresh() {
  try {
    const filtered = query().toString() !== "", separate = filtered || full;
    const [tasks, ...waits] = await Promise.all([api(`/tasks?${query()}`),
      ...(separate ? WAITING.map((s) => api(`/tasks?status=${s}`)) : [])]);
    if (!filtered) full = tasks.length >= LIMIT;
    const waiting = separate ? waits.flat() : tasks.filter((t) => WAITING.includes(t.status));
    tasks.forEach((t) => addStatusOption(t.status));
    $("#rows").innerHTML = tasks.map(row).join("")
      || '<tr><td colspan="9" class="muted">No tasks match.</td></tr>';
    inbox(waiting);
    $("#updated").textContent = `Updated ${new Date().toLocaleTimeString()}; ${tasks.length} shown.`;
    const now = JSON.stringify([...tasks, ...waiting].map((t) => [t.task_id, t.status, t.tokens]));
    const changed = now !== last;
    last = now;
    return { changed, running: [...tasks, ...waiting].some((t) => RUNNING.includes(t.status)) };
  } catch (error) {
    if (error.status !== 401) {  // 401: the sign-in form is showing
      $("#updated").textContent = `Could not load the tasks: ${error.message}`;
    }
    return { changed: false, running: false };
  }
}

async function tick() {
  clearTimeout(timer);
  if (busy) { again = true; return; }  // asked again while a refresh runs: once it ends
  if (document.hidden || $("#signin")) return;  // shown again: visibilitychange
  busy = true;
  let result;
  try { result = await refresh(); } finally { busy = false; }
  delay = again || result.running || result.changed ? POLL_MS
    : Math.min(delay * 2, IDLE_MAX_MS);
  if (again) { again = false; tick(); return; }
  timer = setTimeout(tick, delay);
}

function soon() { delay = POLL_MS; tick(); }

handleSubmit($("#filters"), () => {
  history.replaceState(null, "", `${location.pathname}?${query()}`);
  soon();
});
for (const selector of ["#f-status", "#f-kind"]) {
  $(selector).addEventListener("change", () => $("#filters").requestSubmit());
}
document.addEventListener("visibilitychange", () => { if (!document.hidden) soon(); });
window.addEventListener("focus", soon);
tick();
