// A task's changes, as diffs between its own checkpoints (GET /tasks/{id}/diff), and the
// checkpoints its current run can be rewound or forked to (GET /tasks/{id}/checkpoints):
// the console offers only those, numbered as the API numbers them.
import { api, escapeHtml as e } from "./app.js";

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function lineClass(line) {
  if (line.startsWith("@@")) return "diff-hunk";
  if (line.startsWith("+")) return "diff-add";
  if (line.startsWith("-")) return "diff-del";
  return "";
}

function fileHtml(f) {
  // The diff's own ---/+++ header names the path shown above it
  const lines = f.diff ? f.diff.split("\n").slice(2) : [];
  return `<div class="diff-file" data-path="${e(f.path)}">
    <p><span class="badge change-${e(f.change)}">${e(f.change)}</span> <code>${e(f.path)}</code>${
    f.kind !== "file" ? ` <span class="muted">(${e(f.kind)})</span>` : ""}${
    f.diff ? ` <span class="muted">+${f.added_lines} −${f.removed_lines}</span>` : ""}${
    f.note ? ` <span class="muted">· ${e(f.note)}</span>` : ""}</p>${lines.length
    ? `<pre class="diff">${lines.map((l) => `<span class="${lineClass(l)}">${e(l)}</span>`)
      .join("\n")}</pre>` : ""}</div>`;
}

export function diffHtml(diff) {
  const since = diff.base ? `since checkpoint ${e(diff.base.slice(0, 12))}`
    : "(against an empty workspace)";
  return `<p class="muted">${plural(diff.changed, "path")} changed ${since}</p>${
    diff.files.map(fileHtml).join("")}${diff.truncated ? `<p class="muted">… and ${
    diff.changed - diff.files.length} more changed paths, not listed</p>` : ""}`;
}

// Into `target`: the diff the query names (checkpoint, base, since_start), or why not.
export async function showDiff(taskId, target, query) {
  target.innerHTML = '<p class="muted">Loading the changes…</p>';
  try {
    target.innerHTML = diffHtml(await api(`/tasks/${encodeURIComponent(taskId)}/diff?${
      new URLSearchParams(query)}`));
  } catch (error) {
    const detail = error.body && typeof error.body.detail === "string" ? error.body.detail
      : error.message;
    target.innerHTML = `<p class="error">Changes not shown: ${e(detail)}</p>`;
  }
}

// A <details> that loads its diff each time it is opened (the task may have moved on).
export function diffDetails(taskId, summary, query) {
  const details = document.createElement("details");
  details.className = "changes";
  details.innerHTML = `<summary>${e(summary)}</summary><div class="diff-body"></div>`;
  details.addEventListener("toggle", () => {
    if (details.open) showDiff(taskId, details.querySelector(".diff-body"), query());
  });
  return details;
}

// The current run's checkpoints: "call|checkpoint" -> the number rewind and fork take.
// None when the API cannot tell (Temporal knows no such task): nothing is offered then.
export async function runPoints(taskId) {
  try {
    const run = await api(`/tasks/${encodeURIComponent(taskId)}/checkpoints`);
    return new Map(run.checkpoints.map((c) => [`${c.call}|${c.checkpoint}`, c.step]));
  } catch (error) {
    return null;
  }
}
