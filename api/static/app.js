// Shared helpers: the bearer token (kept for the tab), JSON calls and SSE over fetch.
export const $ = (selector, root = document) => root.querySelector(selector);

export function header() {
  const nav = document.createElement("header");
  nav.innerHTML = `<strong>refloop</strong>
    <a href="prompts.html">System prompts</a><a href="new-task.html">New task</a>
    <a href="reviews.html">Quality reviews</a><a href="code-review.html">Code review</a>`;
  document.body.prepend(nav);
}

function authHeaders() {
  const token = sessionStorage.getItem("refloop-token");
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { "content-type": "application/json", ...authHeaders(), ...(options.headers || {}) },
  });
  if (response.status === 401) {
    const token = prompt("This refloop API needs its bearer token:");
    if (token) { sessionStorage.setItem("refloop-token", token); return api(path, options); }
  }
  const body = response.status === 204 ? null : await response.json().catch(() => null);
  if (!response.ok) { const error = new Error(`HTTP ${response.status}`); error.body = body;
                      error.status = response.status; throw error; }
  return body;
}

// Field errors of a 422 as {field: message}.
export function fieldErrors(error) {
  const out = {};
  for (const item of (error.body && Array.isArray(error.body.detail) ? error.body.detail : [])) {
    out[item.loc[item.loc.length - 1]] = item.msg;
  }
  if (error.body && typeof error.body.detail === "string") out._ = error.body.detail;
  return out;
}

// Server-Sent Events with headers (EventSource cannot send a bearer token).
export async function streamEvents(path, lastId, onEvent) {
  const headers = { ...authHeaders() };
  if (lastId) headers["Last-Event-ID"] = String(lastId);
  const response = await fetch(path, { headers });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
      const fields = {};
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const at = line.indexOf(": ");
        if (at > 0) fields[line.slice(0, at)] = line.slice(at + 2);
      }
      if (fields.event) onEvent({ id: Number(fields.id), type: fields.event,
                                  data: JSON.parse(fields.data) });
    }
  }
}

export function escapeHtml(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
