// The approval page's one script (served from /approvals/static/, never
// inline: the CSP allows no inline script). It only moves bytes between
// the page, the browser's WebAuthn API and the gateway; everything it
// shows is set as text, never as markup.
"use strict";

const b64 = {
  enc(buf) {
    const bytes = new Uint8Array(buf);
    let s = "";
    for (const b of bytes) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  },
  dec(s) {
    const t = s.replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(t + "=".repeat((4 - (t.length % 4)) % 4));
    return Uint8Array.from(bin, (c) => c.charCodeAt(0)).buffer;
  },
};

function say(text) {
  const el = document.getElementById("status");
  if (el) el.textContent = text;
}

async function post(url, body) {
  const csrf = document.body.dataset.csrf;
  const r = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(csrf ? Object.assign({ csrf }, body) : body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* a refusal is text */ }
  if (!r.ok) throw new Error((json && json.message) || text.trim() || r.statusText);
  return json;
}

async function get(options) {
  const pk = options.publicKey;
  pk.challenge = b64.dec(pk.challenge);
  for (const c of pk.allowCredentials || []) c.id = b64.dec(c.id);
  const cred = await navigator.credentials.get({ publicKey: pk });
  return {
    id: cred.id,
    rawId: b64.enc(cred.rawId),
    type: cred.type,
    response: {
      authenticatorData: b64.enc(cred.response.authenticatorData),
      clientDataJSON: b64.enc(cred.response.clientDataJSON),
      signature: b64.enc(cred.response.signature),
      userHandle: cred.response.userHandle ? b64.enc(cred.response.userHandle) : null,
    },
    extensions: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
  };
}

async function create(options) {
  const pk = options.publicKey;
  pk.challenge = b64.dec(pk.challenge);
  pk.user.id = b64.dec(pk.user.id);
  for (const c of pk.excludeCredentials || []) c.id = b64.dec(c.id);
  const cred = await navigator.credentials.create({ publicKey: pk });
  return {
    id: cred.id,
    rawId: b64.enc(cred.rawId),
    type: cred.type,
    response: {
      attestationObject: b64.enc(cred.response.attestationObject),
      clientDataJSON: b64.enc(cred.response.clientDataJSON),
    },
    extensions: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
  };
}

function onSubmit(id, handler) {
  const form = document.getElementById(id);
  if (!form) return;
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => (b.disabled = true));
    try {
      await handler(form, ev.submitter);
    } catch (e) {
      say("refused: " + e.message);
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  });
}

onSubmit("login", async (form) => {
  const name = form.elements.name.value;
  say("asking your passkey…");
  const options = await post("/approvals/login/options", { name });
  const assertion = await get(options);
  await post("/approvals/login/finish", { assertion });
  const next = new URLSearchParams(location.search).get("next");
  location.assign(next && /^[A-Za-z0-9][A-Za-z0-9-]*$/.test(next) ? "/approvals/" + next : "/approvals/");
});

onSubmit("register", async (form) => {
  const name = form.elements.name.value;
  say("creating a passkey…");
  const options = await post("/approvals/passkeys/register/options", { name });
  const response = await create(options);
  const done = await post("/approvals/passkeys/register/finish", { response });
  say("created. Add this entry under passkeys: in config/approvers/data.yaml:");
  document.getElementById("entry").textContent = done.entry;
});

onSubmit("verdict", async (form, submitter) => {
  const id = form.dataset.id;
  const verdict = submitter && submitter.value === "grant" ? "grant" : "deny";
  const reason = form.elements.reason ? form.elements.reason.value : "";
  const made = await post("/approvals/" + id + "/statement", { verdict, reason });
  document.getElementById("statement").textContent =
    "signing sha256 " + made.statement_sha256 + " of:\n" + made.statement;
  say("asking your passkey…");
  const assertion = await get(made.options);
  const done = await post("/approvals/" + id + "/verdict", {
    verdict,
    statement: made.statement,
    assertion,
  });
  say(done.message);
  setTimeout(() => location.reload(), 1500);
});

const logout = document.getElementById("logout");
if (logout) {
  logout.addEventListener("click", async () => {
    try { await post("/approvals/logout", {}); } finally { location.assign("/approvals/login"); }
  });
}
