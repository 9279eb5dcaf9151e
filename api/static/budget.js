// The task page's box for a task waiting for budget: what it spent of which limit, and a
// new limit (POST /tasks/{id}/budget; a total, its supplement children's spend included).
import { $, api, handleSubmit } from "./app.js";

let shownFor = null;  // the status the box was last drawn for

function limitText(budget) {
  const parts = [];
  if (budget.max_cost_usd != null) parts.push(`$${budget.max_cost_usd}`);
  if (budget.max_tokens != null) parts.push(`${budget.max_tokens} tokens`);
  return parts.join(" and ") || "none";
}

async function draw(taskId) {
  const state = await api(`/tasks/${taskId}`);
  const budget = state.budget || {};
  const reason = ((state.waiting || {}).budget || {}).reason;
  $("#budget-why").textContent = reason ? `Its ${reason}.`
    : `Spent $${(state.cost_usd || 0).toFixed(4)}; its limit (${limitText(budget)}) does not `
      + "cover its next model call.";
  $("#budget-cost").value = budget.max_cost_usd != null
    ? String(Math.max(budget.max_cost_usd * 2, (state.cost_usd || 0) * 2)) : "";
  $("#budget-error").textContent = "";
}

export function wire(taskId) {
  handleSubmit($("#budget-form"), async () => {
    const cost = $("#budget-cost").value.trim(), tokens = $("#budget-tokens").value.trim();
    const body = {};
    if (cost) body.max_cost_usd = Number(cost);
    if (tokens) body.max_tokens = Number(tokens);
    try {
      const set = await api(`/tasks/${taskId}/budget`, { method: "POST",
        body: JSON.stringify(body) });
      $("#budget-done").textContent = `Limit set to ${limitText(set)}; ${set.waiting
        ? "it still does not cover the next call" : "the task goes on"}.`;
      $("#budget").hidden = !set.waiting;
      shownFor = null;
    } catch (error) {
      const detail = error.body && error.body.detail;
      $("#budget-error").textContent = `Not set: ${typeof detail === "string" ? detail
        : error.message}`;
    }
  });
}

// Shown while the task waits for budget, hidden otherwise.
export async function budgetBox(taskId, status) {
  const waiting = status === "waiting_for_budget";
  $("#budget").hidden = !waiting;
  if (!waiting || shownFor === status) { shownFor = waiting ? status : null; return; }
  shownFor = status;
  $("#budget-done").textContent = "";
  await draw(taskId);
  if (location.hash === "#budget") $("#budget").scrollIntoView();
}
