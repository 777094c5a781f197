"""Sign a test user in at the test OpenID provider (tests/oidc/provider.mjs)
and print an access token for a resource: the authorization-code flow with
PKCE (S256) and a resource indicator (RFC 8707), driven the way a browser
would (the provider's sign-in and consent forms, cookies, redirects).

    python tests/oidc/login.py --issuer URL --ca CA.pem --client-id ID \
        --redirect-uri URI --user alice --resource https://gw/mcp

Prints the token response as JSON on stdout. Also importable: `login(...)`.

    python tests/oidc/login.py --device URL --ca CA.pem --user bob

completes a device sign-in (RFC 8628) that a device started elsewhere
(`gateway login` shows URL): the code's confirmation, sign-in and consent.
"""

import argparse
import base64
import hashlib
import json
import re
import secrets
import sys
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2 as httpx


class Memory:
    """The storage an MCP SDK OAuth client asks for (its tokens and its
    registration), kept in memory: a test or a check keeps nothing."""

    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info) -> None:
        self.client = client_info


def pkce():
    verifier = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def authorize(http, authorization_url, redirect_uri, user):
    """Follow an authorization request through sign-in and consent to the
    redirect back; returns the redirect's query."""
    url = authorization_url
    for _ in range(20):
        if url.startswith(redirect_uri):
            return parse_qs(urlparse(url).query)
        r = http.get(url)
        if r.status_code in (302, 303):
            url = urljoin(url, r.headers["location"])
            continue
        if r.status_code != 200:
            raise RuntimeError(f"GET {url}: {r.status_code} {r.text[:500]}")
        prompt = re.search(r'name="prompt" value="(\w+)"', r.text)
        action = re.search(r'<form[^>]*action="([^"]+)"', r.text)
        if not prompt or not action:
            raise RuntimeError(f"no sign-in or consent form at {url}: {r.text[:500]}")
        form = {"prompt": prompt.group(1)}
        if form["prompt"] == "login":
            form.update(login=user, password="test")
        r = http.post(urljoin(url, action.group(1)), data=form)
        if r.status_code not in (302, 303):
            raise RuntimeError(f"POST {action.group(1)}: {r.status_code} {r.text[:500]}")
        url = urljoin(url, r.headers["location"])
    raise RuntimeError("too many redirects")


def hidden_inputs(html, form_id):
    """The hidden fields of the form with this id."""
    form = re.search(r'<form[^>]*id="' + re.escape(form_id) + r'"[^>]*>(.*?)</form>', html, re.S)
    if not form:
        return None, None
    action = re.search(r'action="([^"]+)"', form.group(0)).group(1)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"/?>', form.group(1)))
    return action, fields


def device(http, url, user):
    """Follow a device sign-in page through the code's confirmation,
    sign-in and consent to the provider's success page."""
    r = http.get(url)
    for _ in range(30):
        while r.status_code in (302, 303):
            url = urljoin(url, r.headers["location"])
            r = http.get(url)
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.text[:500]}")
        if "Sign-in Success" in r.text:
            return
        action, fields = hidden_inputs(r.text, "op.deviceConfirmForm")
        if action is None and "document.forms[0].submit()" in r.text:
            # A page that submits itself (what a browser would do at once).
            form = re.search(r"<form[^>]*>(.*?)</form>", r.text, re.S)
            action = re.search(r'action="([^"]+)"', form.group(0)).group(1)
            fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"/?>', form.group(1)))
        if action is None:
            prompt = re.search(r'name="prompt" value="(\w+)"', r.text)
            action_m = re.search(r'<form[^>]*action="([^"]+)"', r.text)
            if not prompt or not action_m:
                raise RuntimeError(f"no form at {url}: {r.text[:500]}")
            action, fields = action_m.group(1), {"prompt": prompt.group(1)}
            if fields["prompt"] == "login":
                fields.update(login=user, password="test")
        url = urljoin(url, action)
        r = http.post(url, data=fields)
    raise RuntimeError("too many steps")


def login(issuer, ca, client_id, redirect_uri, user, resource, scope="openid email groups mcp"):
    with httpx.Client(verify=ca, follow_redirects=False, timeout=30) as http:
        meta = http.get(issuer.rstrip("/") + "/.well-known/openid-configuration").json()
        verifier, challenge = pkce()
        state = secrets.token_urlsafe(16)
        request = httpx.URL(
            meta["authorization_endpoint"],
            params={
                "client_id": client_id,
                "response_type": "code",
                "redirect_uri": redirect_uri,
                "scope": scope,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                "state": state,
                "resource": resource,
                "prompt": "consent",
            },
        )
        back = authorize(http, str(request), redirect_uri, user)
        if "code" not in back:
            raise RuntimeError(f"the provider refused: {back}")
        if back.get("state") != [state]:
            raise RuntimeError("state mismatch")
        r = http.post(
            meta["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": back["code"][0],
                "redirect_uri": redirect_uri,
                "client_id": client_id,
                "code_verifier": verifier,
                "resource": resource,
            },
        )
        if r.status_code != 200:
            raise RuntimeError(f"token endpoint: {r.status_code} {r.text}")
        return r.json()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--issuer")
    p.add_argument("--ca", required=True)
    p.add_argument("--client-id")
    p.add_argument("--redirect-uri")
    p.add_argument("--user", required=True)
    p.add_argument("--resource")
    p.add_argument("--device")
    a = p.parse_args()
    try:
        if a.device:
            with httpx.Client(verify=a.ca, follow_redirects=False, timeout=30) as http:
                device(http, a.device, a.user)
            print(json.dumps({"device": "confirmed"}))
            return
        print(json.dumps(login(a.issuer, a.ca, a.client_id, a.redirect_uri, a.user, a.resource)))
    except RuntimeError as e:
        print(f"login.py: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
