// The task page's box for a task waiting for its host: move it to another live host
// (POST /tasks/{id}/move), after a confirmation that says what the move does.
import { $, api, escapeHtml, handleSubmit } from "./app.js";

let shownFor = null;  // the status the box was last drawn for

function hostOption(host) {
  return `<option value="${escapeHtml(host.host_id)}">${escapeHtml(host.host_id)} (roots: ${
    escapeHtml(host.roots.join(", ") || "none")})</option>`;
}

async function draw(taskId) {
  const [state, hosts] = await Promise.all([api(`/tasks/${taskId}`), api("/hosts")]);
  const others = hosts.filter((h) => h.live && h.host_id !== state.host);
  $("#move-why").textContent = `No worker of host ${state.host || "(none)"} has taken the `
    + "task's next call. Start a worker there, or move the task to another live host.";
  $("#move-host").innerHTML = others.map(hostOption).join("");
  $("#move-form").hidden = !others.length;
  $("#move-none").hidden = Boolean(others.length);
  $("#move-confirm").hidden = true;
  $("#move-error").textContent = "";
  return state;
}

export function wire(taskId) {
  handleSubmit($("#move-form"), () => {
    const host = $("#move-host").value, workspace = $("#move-workspace").value.trim();
    $("#move-question").textContent = `Move this task to host ${host}? Its latest workspace `
      + `checkpoint is put at ${workspace || "the same path"} there before the waiting call `
      + "runs; files a checkpoint leaves out (.git, build output) are not copied.";
    $("#move-confirm").hidden = false;
    $("#move-confirm-yes").focus();
  });
  $("#move-confirm-no").addEventListener("click", () => { $("#move-confirm").hidden = true; });
  $("#move-confirm-yes").addEventListener("click", async () => {
    const host = $("#move-host").value, workspace = $("#move-workspace").value.trim();
    $("#move-confirm").hidden = true;
    try {
      const moved = await api(`/tasks/${taskId}/move`, { method: "POST",
        body: JSON.stringify(workspace ? { host, workspace } : { host }) });
      $("#move-error").textContent = "";
      $("#move-done").textContent = `Moved from host ${moved.moved_from || "(none)"} to host ${
        moved.host}; the task goes on there.`;
      $("#move").hidden = true;
      shownFor = null;
    } catch (error) {
      const detail = error.body && error.body.detail;
      $("#move-error").textContent = `Not moved: ${typeof detail === "string" ? detail
        : error.message}`;
    }
  });
}

// Shown while the task waits for its host, hidden otherwise.
export async function moveBox(taskId, status) {
  const waiting = status === "waiting_for_host";
  $("#move").hidden = !waiting;
  if (!waiting || shownFor === status) { shownFor = waiting ? status : null; return; }
  shownFor = status;
  $("#move-done").textContent = "";
  await draw(taskId);
  if (location.hash === "#move") $("#move").scrollIntoView();
}
