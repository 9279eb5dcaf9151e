// What each event of a task means, in words: one function per event type. An event this
// page does not know yet is shown by its name and data, never dropped.
import { escapeHtml } from "./app.js";

// A supplement's task text ends with its missing actions under a marker; runs recorded
// before it was English carry the original Chinese one, shown here in English.
const LEGACY_SUPPLEMENT_MARKER = "【需要补充的操作】";
export function englishTask(text) {
  return String(text ?? "").replaceAll(LEGACY_SUPPLEMENT_MARKER, "Missing actions to supplement:");
}

const e = escapeHtml;
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function content(text, label = "output") {
  const body = e(text || "");
  if (!body) return "";
  return String(text).length > 300
    ? `<details><summary>${label} (${String(text).length} characters)</summary><pre>${body}</pre></details>`
    : `<pre>${body}</pre>`;
}

function argsLine(args) {
  const parts = Object.entries(args || {}).map(([key, value]) => {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    const line = text.split("\n")[0];
    return `${key}: ${line.length > 60 ? `${line.slice(0, 59)}…` : line}${
      text.includes("\n") ? ` (+${text.split("\n").length - 1} lines)` : ""}`;
  });
  return parts.join(" · ");
}

// A call that may have changed the workspace: the checkpoint taken after it (or why none).
function checkpointNote(d) {
  if (d.checkpoint) return ` <span class="muted">· checkpoint ${e(d.checkpoint.slice(0, 12))}</span>`;
  if (d.checkpoint_error) return ` <span class="muted">· no checkpoint: ${e(d.checkpoint_error)}</span>`;
  return "";
}

function list(items) {
  return items && items.length ? `<ul>${items.map((i) => `<li>${e(i)}</li>`).join("")}</ul>` : "";
}

function planSteps(plan) {
  return `<ol>${(plan?.steps || []).map((s) => `<li>${e(s.goal)} <span class="badge">${
    e(s.tool)}</span></li>`).join("")}</ol>`;
}

// Why a reflection ran (workflows/triggers.py names the early ones).
const TRIGGERS = {
  completeness: "completeness check",
  quality_review: "after a failed quality review",
  result_anomaly: "a tool failed or returned nothing",
  repetition: "the same call repeated",
  step_stuck: "a step is taking too long",
  slow_progress: "slow progress",
  checkpoint: "behind schedule",
};

function reflection(d) {
  if (d.trigger === "completeness") {
    const verdictText = d.fail_open
      ? "the judge did not answer, so the work counts as complete"
      : d.is_complete ? "the work is complete" : `the work is incomplete: ${plural(
        d.missing_count ?? (d.missing_aspects || []).length, "missing aspect")}`;
    return { html: `<span class="event-title">Reflection (completeness check${
      d.round ? `, round ${d.round}` : ""})</span>: ${e(verdictText)}
      ${d.analysis ? `<p>${e(d.analysis)}</p>` : ""}${list(d.missing_aspects)}`,
    cls: `reflection ${d.is_complete ? "pass" : "fail"}` };
  }
  const why = TRIGGERS[d.trigger] || `trigger ${d.trigger}`;
  const detail = d.evidence || d.message || "";
  return { html: `<span class="event-title">Reflection (${e(why)}${d.iteration
    ? `, iteration ${d.iteration}` : ""})</span>${d.level > 1 ? ` <span class="badge">${
    e(d.level)} times</span>` : ""}
    ${detail ? `<p>${e(detail)}</p>` : ""}`, cls: "reflection" };
}

const DESCRIBE = {
  intent: (d) => d.intent
    ? `Intent: <strong>${e(d.intent)}</strong>${d.reason ? ` — ${e(d.reason)}` : ""}`
    : `Intent unknown (the classifier failed, so the task goes on and plans): ${e(d.error || "")}`,
  constraints: (d) => `Task type <strong>${e(d.task_type)}</strong>; tools it may not use: ${
    e((d.forbidden || []).join(", ") || "none")}`,
  plan: (d) => `<span class="event-title">Plan</span> (${plural((d.steps || []).length, "step")})`,
  plan_rejected: (d) => `Plan attempt ${e(d.attempt)} rejected, planning again:${list(d.violations)}`,
  plan_skipped: (d) => `No plan: the task is answered directly (${e(d.reason || "")})`,
  step: (d) => d.step ? `Now on step ${e(d.step)}: ${e(d.goal || "")}`
    : "Every step of the plan is done",
  workspace: (d) => d.error
    ? { html: `Workspace could not be read: ${e(d.error)}`, cls: "fail" }
    : `Workspace read: ${e(d.context_chars)} characters of context for the model; ${
      d.indexing ? "semantic index building in the background" : "no semantic index for this task"}`,
  index: (d) => {
    if (d.status === "done" && d.available === false) {
      return `Semantic index unavailable${d.note ? `: ${e(d.note)}` : ""}`;
    }
    if (d.status === "done") {
      return `Semantic index ready: ${plural(d.files_seen, "file")} seen, ${
        d.files_indexed} indexed, ${d.files_unchanged} unchanged, ${d.files_removed} removed; ${
        plural(d.chunks_total, "chunk")} in all (${Number(d.seconds || 0).toFixed(1)} s)${
        d.note ? `. ${e(d.note)}` : ""}`;
    }
    if (d.status === "cancelled") return `Semantic indexing stopped: ${e(d.reason || "")}`;
    return { html: `Semantic indexing failed: ${e(d.error || d.reason || "")}`, cls: "fail" };
  },
  mcp_tools: (d) => {
    const tools = d.tools || [], dropped = d.dropped || [];
    return { html: `MCP servers ${e((d.servers || []).join(", "))}: ${plural(tools.length, "tool")
      } offered${tools.length ? ` (${e(tools.join(", "))})` : ""}${dropped.length
      ? `; left out:${list(dropped)}` : ""}`, cls: dropped.length ? "warn" : "" };
  },
  tool_call: (d) => `→ <strong>${e(d.tool)}</strong> <span class="muted">${e(argsLine(d.args))}</span>`,
  tool_result: (d) => d.ok
    ? `← <strong>${e(d.tool)}</strong> succeeded${checkpointNote(d)}${content(d.output)}`
    : { html: `← <strong>${e(d.tool)}</strong> failed: <span class="error">${e(d.error)}</span>${
      checkpointNote(d)}${content(d.output)}`, cls: "fail" },
  tool_violation: (d) => ({ html: `Tool <strong>${e(d.tool)}</strong> is not allowed for this task type${
    d.justified ? `; allowed once with the justification: ${e(d.justification)}` : "; refused"}`,
  cls: d.justified ? "warn" : "fail" }),
  abnormal_output: (d) => ({ html: `The model's answer in iteration ${e(d.iteration)} was unusable: ${
    e(d.reason)}`, cls: "fail" }),
  quality_review: (d, { verdict }) => {
    const v = verdict(d);
    const extra = ["passed", "failed"].includes(d.outcome) ? ""
      : ` <span class="badge">${e(String(d.outcome).replaceAll("_", " "))}</span>`;
    return { html: `<span class="event-title">Quality review of ${e(d.file_path)}: ${v.label}</span>${extra}
      ${d.summary ? `<p>${e(d.summary)}</p>` : ""}${list(d.reasons)}${d.cap_reached
      ? "<p>Review rounds for this file are used up: it is not reviewed again.</p>" : ""}`,
    cls: `${v.cls} quality-review` };
  },
  quality_review_skipped: (d) => `Quality review of ${e(d.file_path)} skipped: ${
    d.reason === "cap" ? "its review rounds are used up" : e(d.reason)}`,
  reflection,
  reflection_plan: (d) => `<span class="event-title">Supplement planned</span> for ${plural(
    d.supplements_count, "missing action")}:${planSteps(d.plan)}`,
  reflection_exec: (d) => {
    const link = `<a href="task.html?id=${encodeURIComponent(d.child_workflow_id)}">${e(d.child_workflow_id)}</a>`;
    return d.error
      ? { html: `<span class="event-title">Supplement run ${link} failed</span>: ${e(d.error)}`, cls: "fail" }
      : { html: `<span class="event-title">Supplement run ${link}</span>: ${d.succeeded} of ${
        plural(d.attempted, "tool call")} succeeded`, cls: d.succeeded === d.attempted ? "pass" : "" };
  },
  approval_required: (d) => `Waiting for approval of <strong>${e(d.tool)}</strong> (call ${e(d.call_id)})`,
  approval_decided: (d) => ({ html: `Approval ${d.approved ? "granted" : "rejected"} for call ${
    e(d.call_id)}${d.edited ? " with edited arguments" : ""}${d.comment ? `: ${e(d.comment)}` : ""}${
    d.edited ? editedArguments(d.original_arguments, d.arguments) : ""}`, cls: d.approved ? "pass" : "fail" }),
  approval_expired: (d) => ({ html: `<span class="event-title">No decision</span> on call ${
    e(d.call_id)} (${e(d.tool)}) within ${e(d.waited)}: the task ends incomplete`, cls: "fail" }),
  waiting_for_host: (d) => ({ html: `<span class="event-title">Waiting for host ${e(d.host)}</span>: no worker of it took ${
    e(d.activity)} within ${Math.round(d.after_s || 0)} s. Start a worker there, or move the task to another host.`,
  cls: "warn" }),
  host_back: (d) => ({ html: `Host ${e(d.host)} is back; the task goes on${d.since
    ? ` (it waited from ${e(new Date(d.since).toLocaleTimeString())})` : ""}`, cls: "pass" }),
  waiting_for_model: (d) => ({ html: `<span class="event-title">Waiting for the model</span> at ${
    e(d.endpoint || "its endpoint")}: ${e(d.error || "")}. The call is tried again until the endpoint answers or the outage bound is reached.`,
  cls: "warn" }),
  model_back: (d) => ({ html: `<span class="event-title">Model back</span>: ${
    e(d.endpoint || "its endpoint")} answers again after ${Math.round(d.waited_s || 0)} s; the task goes on`,
  cls: "pass" }),
  waiting_for_budget: (d) => ({ html: `<span class="event-title">Waiting for budget</span>: ${
    e(d.reason || "")}. No model call goes out until the limit is raised.`, cls: "warn" }),
  budget_raised: (d) => `Limit set: ${d.max_cost_usd != null ? `$${e(d.max_cost_usd)}` : "no cost limit"}${
    d.max_tokens != null ? `, ${e(d.max_tokens)} tokens` : ""} (spent $${e((d.cost_usd || 0).toFixed(4))})`,
  budget_resumed: (d) => ({ html: `<span class="event-title">Budget raised</span>: the task goes on after ${
    Math.round(d.waited_s || 0)} s`, cls: "pass" }),
  moved_to_host: (d) => `Moved from host ${e(d.from || "(none)")} to host ${e(d.to)}`,
  rewind: (d) => ({ html: `<span class="event-title">Rewind asked</span> to checkpoint ${e(d.step)}: the task stops at its next safe point to put it back`, cls: "warn" }),
  rewound: (d) => ({ html: `<span class="event-title">Rewound</span> to checkpoint ${e(d.step)} (${
    e(String(d.checkpoint || "").slice(0, 12))}): files, conversation and plan progress as they were just after that call; ${
    plural(d.edits_taken_back || 0, "edit")} taken back, ${plural(d.written || 0, "path")} written, ${
    plural(d.removed || 0, "path")} removed${d.rewound_tokens ? `; the ${plural(d.rewound_calls || 0, "model call")} taken back (${
    plural(d.rewound_tokens, "token")}) stay in the task's stats, marked rewound` : ""}`, cls: "warn" }),
  rewind_failed: (d) => ({ html: `<span class="event-title">Rewind to checkpoint ${e(d.step)} failed</span>: ${
    e(d.error || "")}`, cls: "fail" }),
  rewound_cost: (d) => `The rewound steps cost ${plural(d.tokens || 0, "token")} in ${
    plural(d.calls || 0, "model call")}: kept in the task's stats, marked rewound`,
  forked_from: (d) => `<span class="event-title">Forked</span> from <a href="task.html?id=${
    encodeURIComponent(d.task_id)}">${e(d.task_id)}</a> at checkpoint ${e(d.step)} (${
    e(String(d.checkpoint || "").slice(0, 12))})${d.instruction ? `, with a new instruction: ${e(d.instruction)}` : ""}`,
  forked: (d) => `A fork of this task started: <a href="task.html?id=${encodeURIComponent(d.task_id)}">${
    e(d.task_id)}</a>, from checkpoint ${e(d.step)}`,
  workspace_restored: (d) => `<span class="event-title">Workspace put back</span> to checkpoint ${
    e(String(d.checkpoint || "").slice(0, 12))}: ${plural(d.written || 0, "path")} written, ${
    plural(d.removed || 0, "path")} removed, ${e(d.unchanged || 0)} unchanged`,
  compacted: (d) => d.kind === "summary"
    ? `<span class="event-title">Compacted</span>: ${plural(d.turns_folded || 0, "earlier message")} folded into a summary ${
      d.by_model === false ? "listing the calls made (the model could not summarise)" : "the model wrote"}, ${
      e(d.tokens_before)} → ${e(d.tokens_after)} tokens (window ${e(d.window)}); the notes, the files written and the plan's progress kept${
      d.summary_tokens ? `; the summary cost ${plural(d.summary_tokens, "token")}` : ""}`
    : `<span class="event-title">${d.kind === "folded" ? "Folded" : "Masked"}</span> to fit the model's window: ${
      d.kind === "folded" ? `${plural(d.turns_folded || 0, "earlier message")} folded into one note`
        : `${plural(d.masked || 0, "older tool output")} masked to a line each`}, ${
      e(d.tokens_before)} → ${e(d.tokens_after)} tokens (window ${e(d.window)})`,
  continued_as_new: (d) => `Continued as a new run after iteration ${e(d.iteration)} (history of ${
    e(d.history_length)} events)`,
  summary: (d) => d.summary ? `<span class="event-title">Summary</span> ${e(d.summary)}`
    : `No summary: ${e(d.error || "")}`,
  completed: (d) => ({ html: `<span class="event-title">Completed</span>${content(d.answer, "answer")}`,
    cls: "pass" }),
  incomplete: (d) => ({ html: `<span class="event-title">Incomplete</span>: the run ended with work missing:${
    list(d.missing)}`, cls: "fail" }),
  // A cancelled run ends with `failed` (stop reason `cancelled`): it did not fail
  failed: (d) => (d.stop_reason === "cancelled" ? DESCRIBE.cancelled(d) : {
    html: `<span class="event-title">Failed</span> (${e(String(d.stop_reason || "error")
      .replaceAll("_", " "))}): ${e(d.error || "")}`, cls: "fail" }),
  lost: (d) => ({ html: `<span class="event-title">Lost</span>: ${e(d.error || "")}`, cls: "fail" }),
  cancelled: (d) => ({ html: `<span class="event-title">Cancelled</span>${
    d.error && d.error !== "cancelled by request" ? `: ${e(d.error)}` : ""}`, cls: "warn" }),
};

// What a person changed in a call's arguments before approving it: each changed argument,
// the model's value, then the one that ran.
function editedArguments(before = {}, after = {}) {
  const text = (v) => (v === undefined ? "(none)" : typeof v === "string" ? v : JSON.stringify(v));
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])]
    .filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]));
  return `<dl class="facts edited-arguments">${keys.map((k) => `<dt>${e(k)}</dt><dd><del>${
    e(text(before[k]))}</del> <ins>${e(text(after[k]))}</ins></dd>`).join("")}</dl>`;
}

export function describe(event, helpers) {
  const render = DESCRIBE[event.type];
  if (!render) {
    return { html: `<span class="event-title">${e(event.type.replaceAll("_", " "))}</span>
      <span class="muted">${e(JSON.stringify(event.data).slice(0, 300))}</span>`, cls: "" };
  }
  const out = render(event.data || {}, helpers);
  return typeof out === "string" ? { html: out, cls: "" } : out;
}
