// Shared helpers: the bearer token (kept for the tab), sign-in, JSON calls, SSE over fetch.
export const $ = (selector, root = document) => root.querySelector(selector);
const TOKEN_KEY = "refloop-token";

// `refloop up` off loopback prints /ui/#token=...: keep it for the tab, drop it from the URL.
const fromUrl = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromUrl) {
  sessionStorage.setItem(TOKEN_KEY, fromUrl);
  history.replaceState(null, "", location.pathname + location.search);
}

export function header() {
  const nav = document.createElement("header");
  nav.innerHTML = `<strong>refloop</strong>
    <a href="index.html">Tasks</a><a href="new-task.html">New task</a>
    <a href="prompts.html">System prompts</a>
    <a href="reviews.html">Quality reviews</a><a href="code-review.html">Code review</a>
    <a href="hosts.html">Hosts</a><a href="/docs">API docs</a>`;
  const here = location.pathname.split("/").pop() || "index.html";
  nav.querySelectorAll("a").forEach((a) => {
    if (a.getAttribute("href") === here) a.setAttribute("aria-current", "page");
  });
  if (sessionStorage.getItem(TOKEN_KEY)) {
    const out = document.createElement("button");
    out.type = "button"; out.className = "secondary"; out.textContent = "Sign out";
    out.addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); signIn(); });
    nav.append(out);
  }
  document.body.prepend(nav);
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// A visible sign-in form (never prompt(): it blocks, and headless browsers cannot answer).
// Signing in reloads the page, which then loads everything with the token.
export function signIn(message = "This refloop API needs its token.") {
  let form = $("#signin");
  if (!form) {
    form = document.createElement("form");
    form.id = "signin"; form.className = "card fail";
    form.innerHTML = `<h2>Sign in</h2><p id="signin-why"></p>
      <label for="signin-token">API token</label>
      <input id="signin-token" type="password" autocomplete="current-password" required>
      <p><button type="submit">Sign in</button></p>`;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("#signin-token").value.trim());
      const next = new URLSearchParams(location.search).get("next");
      if (next && next.startsWith("/") && !next.startsWith("//")) location.href = next;
      else location.reload();
    });
    (document.querySelector("main") || document.body).prepend(form);
  }
  $("#signin-why").textContent = message;
  $("#signin-token").focus();
}

function unauthorized() {
  const had = Boolean(sessionStorage.getItem(TOKEN_KEY));
  sessionStorage.removeItem(TOKEN_KEY);
  signIn(had ? "The token was refused; enter it again." : "This refloop API needs its token.");
  const error = new Error("HTTP 401"); error.status = 401; error.body = null;
  return error;
}

// A form handled by script ships its submit buttons disabled; they come alive here, with
// the handler, so a click before the script runs cannot fall through to the browser's own
// submit (which reloads the page and drops what was typed).
export function handleSubmit(form, handler) {
  form.addEventListener("submit", (event) => { event.preventDefault(); return handler(event); });
  form.querySelectorAll("button[type=submit]").forEach((button) => { button.disabled = false; });
}

export async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { "content-type": "application/json", ...authHeaders(), ...(options.headers || {}) },
  });
  if (response.status === 401) throw unauthorized();
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
export async function streamEvents(path, lastId, onEvent, signal = undefined) {
  const headers = { ...authHeaders() };
  if (lastId) headers["Last-Event-ID"] = String(lastId);
  const response = await fetch(path, { headers, signal });
  if (response.status === 401) throw unauthorized();
  if (!response.ok) { const error = new Error(`HTTP ${response.status}`);
                      error.status = response.status; throw error; }
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

// A quality review's verdict: UNAVAILABLE (no reviewer answered) is never shown as a pass.
export function verdict(review) {
  if (review.outcome === "unavailable") return { label: "UNAVAILABLE", cls: "unavailable" };
  return review.pass ? { label: "PASS", cls: "pass" } : { label: "FAIL", cls: "fail" };
}
