// Drives Debian's Chromium (headless, through playwright-core) through the
// approval page as people and attackers would, for tests/http_sso.rs.
// Every WebAuthn ceremony is answered by a virtual authenticator (Chrome
// DevTools Protocol, WebAuthn domain) with user verification on, or off
// where a step says so. Prints one JSON report on its last line; the Rust
// test judges it.
//
// Environment: BASE (https://127.0.0.1:PORT), APPROVAL (a pending
// approval id, requested by alice), APPROVERS_FILE (the daemon's
// config/approvers/data.yaml, where the registered passkeys are listed),
// BIG and HOSTILE (approval ids with 2,000 changes and with markup and
// bidi characters), SHOTS (a dir for screenshots).
import { chromium } from "playwright-core";
import fs from "node:fs";
import https from "node:https";

const { BASE, APPROVAL, APPROVERS_FILE, BIG, HOSTILE, SHOTS } = process.env;
const report = {};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

async function person() {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  await cdp.send("WebAuthn.enable");
  const { authenticatorId } = await cdp.send("WebAuthn.addVirtualAuthenticator", {
    options: { protocol: "ctap2", transport: "internal", hasResidentKey: true,
      hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true },
  });
  const verified = (on) => cdp.send("WebAuthn.setUserVerified", { authenticatorId, isUserVerified: on });
  return { context, page, verified };
}

async function status(page) {
  await page.waitForFunction(() => {
    const t = document.getElementById("status")?.textContent || "";
    return t && !t.endsWith("…");
  }, null, { timeout: 20000 });
  return page.locator("#status").textContent();
}

async function register(p, name) {
  await p.page.goto(`${BASE}/approvals/passkeys/register`);
  await p.page.fill("input[name=name]", name);
  await p.page.click("button[type=submit]");
  await p.page.waitForFunction(() => document.getElementById("entry")?.textContent
    || (document.getElementById("status")?.textContent || "").startsWith("refused"), null, { timeout: 20000 });
  const entry = await p.page.locator("#entry").textContent();
  if (!entry) throw new Error("registration: " + await p.page.locator("#status").textContent());
  return entry;
}

async function signIn(p, name, next) {
  await p.page.goto(`${BASE}/approvals/login?next=${next}`);
  await p.page.fill("input[name=name]", name);
  await p.page.click("button[type=submit]");
  await p.page.waitForURL(`${BASE}/approvals/${next}`, { timeout: 20000 });
}

// A request as a forger makes it: any headers, the victim's cookie.
function raw(path, headers, body, method = "POST") {
  return new Promise((resolve) => {
    const req = https.request(`${BASE}${path}`, { method, headers, rejectUnauthorized: false }, (res) => {
      let text = "";
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, text }));
    });
    req.end(body);
  });
}

// A hand-made verdict from inside the page: the statement, then an
// assertion asked with the user verification the caller chooses.
async function handMadeVerdict(page, id, verdict, userVerification) {
  return page.evaluate(async ({ id, verdict, userVerification }) => {
    const csrf = document.body.dataset.csrf;
    const post = async (url, body) => {
      const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(Object.assign({ csrf }, body)) });
      return { status: r.status, text: await r.text() };
    };
    const dec = (s) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4)), (c) => c.charCodeAt(0)).buffer;
    const enc = (b) => btoa(String.fromCharCode(...new Uint8Array(b))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    const made = await post(`/approvals/${id}/statement`, { verdict, reason: "hand made" });
    if (made.status !== 200) return { step: "statement", ...made };
    const { statement, options } = JSON.parse(made.text);
    const pk = options.publicKey;
    pk.challenge = dec(pk.challenge);
    pk.allowCredentials = (pk.allowCredentials || []).map((c) => ({ ...c, id: dec(c.id) }));
    pk.userVerification = userVerification;
    let cred;
    try {
      cred = await navigator.credentials.get({ publicKey: pk });
    } catch (e) {
      return { step: "get", status: 0, text: String(e) };
    }
    const assertion = { id: cred.id, rawId: enc(cred.rawId), type: cred.type, extensions: {},
      response: { authenticatorData: enc(cred.response.authenticatorData),
        clientDataJSON: enc(cred.response.clientDataJSON), signature: enc(cred.response.signature) } };
    return { step: "verdict", ...(await post(`/approvals/${id}/verdict`, { verdict, statement, assertion })) };
  }, { id, verdict, userVerification });
}

try {
  // Registration: bob (an approver) and alice (who asked for the call).
  const bob = await person();
  const alice = await person();
  const bobEntry = await register(bob, "bob");
  const aliceEntry = await register(alice, "alice");
  report.registered = [bobEntry.includes('"name":"bob"'), aliceEntry.includes('"name":"alice"')];
  // Not yet listed: no sign-in.
  await bob.page.goto(`${BASE}/approvals/login`);
  await bob.page.fill("input[name=name]", "bob");
  await bob.page.click("button[type=submit]");
  report.unlisted_sign_in = await status(bob.page);
  // A policy author lists both.
  const text = fs.readFileSync(APPROVERS_FILE, "utf8");
  fs.writeFileSync(APPROVERS_FILE, text.replace("passkeys: []", `passkeys:\n${bobEntry}\n${aliceEntry}\n`));

  // Without a session, the page sends the reader to sign in.
  await bob.page.goto(`${BASE}/approvals/${APPROVAL}`);
  report.anonymous_url = bob.page.url().replace(BASE, "");
  // The sign-in's last step as the browser sent it (body and cookie), to
  // replay from another client.
  let finish = null;
  bob.page.on("requestfinished", async (r) => {
    if (!r.url().endsWith("/approvals/login/finish")) return;
    const res = await r.response();
    if (res && res.status() === 200) finish = { body: r.postData(), headers: await r.allHeaders() };
  });
  // Sign in (retried while the daemon reloads its policy).
  for (let i = 0; ; i++) {
    try { await signIn(bob, "bob", APPROVAL); break; } catch (e) { if (i > 20) throw e; await bob.page.waitForTimeout(500); }
  }
  // The same sign-in sent again by someone who captured it: refused, no
  // second session.
  await bob.page.waitForTimeout(200);
  report.replayed_sign_in = finish
    ? await raw("/approvals/login/finish", { cookie: finish.headers.cookie, origin: BASE,
      "content-type": "application/json", "sec-fetch-site": "same-origin" }, finish.body)
    : { status: 0, text: "the sign-in was not captured" };
  const order = await bob.page.evaluate(() => [...document.querySelectorAll("main section")].map((s) => s.className));
  report.sections = order;
  report.headers = await bob.page.evaluate(async () => {
    const r = await fetch(location.href);
    return Object.fromEntries(["content-security-policy", "x-frame-options", "cache-control", "referrer-policy"].map((h) => [h, r.headers.get(h)]));
  });
  report.cookie = (await bob.context.cookies()).find((c) => c.name === "__Host-gw_session");
  await bob.page.screenshot({ path: `${SHOTS}/approval.png`, fullPage: true });

  // Forgeries with bob's session cookie: another origin, no CSRF token, a form post.
  const cookie = `__Host-gw_session=${report.cookie.value}`;
  const csrf = await bob.page.evaluate(() => document.body.dataset.csrf);
  const body = JSON.stringify({ csrf, verdict: "grant", reason: "forged" });
  report.forged_origin = await raw(`/approvals/${APPROVAL}/statement`,
    { cookie, origin: "https://evil.example", "content-type": "application/json" }, body);
  report.forged_no_csrf = await raw(`/approvals/${APPROVAL}/statement`,
    { cookie, origin: BASE, "content-type": "application/json" }, JSON.stringify({ verdict: "grant" }));
  report.forged_form = await raw(`/approvals/${APPROVAL}/statement`,
    { cookie, origin: BASE, "content-type": "application/x-www-form-urlencoded" }, "verdict=grant");
  // A second session cookie planted beside the real one: neither counts.
  report.planted_cookie = await raw(`/approvals/${APPROVAL}/statement`,
    { cookie: `${cookie}; __Host-gw_session=planted`, origin: BASE, "content-type": "application/json" }, body);
  report.forged_verdict_without_passkey = await raw(`/approvals/${APPROVAL}/verdict`,
    { cookie, origin: BASE, "content-type": "application/json" },
    JSON.stringify({ csrf, verdict: "grant", statement: "{}", assertion: {} }));

  // The requester's own session: no grant button, and a crafted grant is refused.
  for (let i = 0; ; i++) {
    try { await signIn(alice, "alice", APPROVAL); break; } catch (e) { if (i > 20) throw e; await alice.page.waitForTimeout(500); }
  }
  report.requester_grant_buttons = await alice.page.locator("button.grant").count();
  report.requester_notice = await alice.page.locator(".decide .refused").textContent();
  report.requester_crafted = await handMadeVerdict(alice.page, APPROVAL, "grant", "required");
  await alice.page.screenshot({ path: `${SHOTS}/requester.png`, fullPage: true });

  // bob's authenticator without user verification: the browser refuses a
  // "required" request, and an assertion asked without it is refused by the gateway.
  await bob.verified(false);
  report.unverified = await handMadeVerdict(bob.page, APPROVAL, "grant", "discouraged");
  await bob.page.fill("input[name=reason]", "reviewed on the page");
  await bob.page.click("button.grant");
  report.unverified_click = await status(bob.page);
  await bob.verified(true);

  // bob approves with his passkey, verified.
  await bob.page.reload();
  await bob.page.fill("input[name=reason]", "reviewed on the page");
  await bob.page.click("button.grant");
  report.approved = await status(bob.page);
  await bob.page.waitForTimeout(2000);
  report.after = await bob.page.locator("h1").textContent();

  // A plan of 2,000 changes, and a hostile one.
  const started = Date.now();
  await bob.page.goto(`${BASE}/approvals/${BIG}`, { waitUntil: "load" });
  report.big_ms = Date.now() - started;
  report.big_changes = await bob.page.locator(".change").count();
  await bob.page.screenshot({ path: `${SHOTS}/many-resources.png` });
  await bob.page.goto(`${BASE}/approvals/${HOSTILE}`);
  report.hostile_scripts = await bob.page.evaluate(() => document.querySelectorAll("script").length);
  report.hostile_links = await bob.page.evaluate(() => [...document.querySelectorAll("a")].map((a) => a.getAttribute("href")));
  report.hostile_text = await bob.page.locator(".signals").textContent();
  report.hostile_alerted = await bob.page.evaluate(() => window.__pwned === true);
  await bob.page.screenshot({ path: `${SHOTS}/hostile.png`, fullPage: true });

  // Sign out: the session ends on the server, so its cookie, kept by
  // someone who copied it, reads nothing afterwards.
  const kept = `__Host-gw_session=${(await bob.context.cookies()).find((c) => c.name === "__Host-gw_session").value}`;
  report.before_sign_out = (await raw("/approvals/", { cookie: kept }, undefined, "GET")).status;
  await bob.page.goto(`${BASE}/approvals/`);
  await bob.page.click("#logout");
  await bob.page.waitForTimeout(1000);
  report.after_sign_out = await raw("/approvals/", { cookie: kept }, undefined, "GET");
} catch (e) {
  report.error = String(e && e.stack || e);
}
await browser.close();
console.log(JSON.stringify(report));
