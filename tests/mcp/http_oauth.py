"""The official MCP Python SDK's own OAuth client against the gateway's HTTP
transport: no token handed in. From the gateway's 401 the SDK finds the
Protected Resource Metadata, then the authorization server it names, registers
itself (dynamic client registration), sends the person to sign in (the
authorization-code flow with PKCE and the resource indicator), and retries
with the token it got.

    python http_oauth.py URL CA USER

The person's sign-in at the provider's pages is played by tests/oidc/login.py
(what a browser would do). Prints PASS lines; raises on any failed check.
"""

import os
import sys

import anyio
import httpx2
from mcp import Client, types
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oidc"))
from login import Memory, authorize  # noqa: E402

URL, CA, USER = sys.argv[1:4]
REDIRECT = "http://127.0.0.1:53683/callback"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def main():
    back = {}
    seen = {}

    async def redirect_handler(url: str) -> None:
        seen["authorization_url"] = url

        def sign_in():
            with httpx2.Client(verify=CA, follow_redirects=False, timeout=30) as http:
                return authorize(http, url, REDIRECT, USER)

        back.update(await anyio.to_thread.run_sync(sign_in))

    async def callback_handler() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(
            code=back["code"][0],
            state=back.get("state", [None])[0],
            iss=back.get("iss", [None])[0],
        )

    storage = Memory()
    auth = OAuthClientProvider(
        server_url=URL,
        client_metadata=OAuthClientMetadata(
            client_name="gateway-e2e-oauth",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
            scope="openid email groups mcp",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    http = httpx2.AsyncClient(auth=auth, verify=CA, timeout=httpx2.Timeout(30, read=600))
    info = types.Implementation(name="sdk-oauth-client", version="1")
    async with Client(streamable_http_client(URL, http_client=http), client_info=info) as c:
        check("resource=" in seen.get("authorization_url", ""), seen)
        check(storage.client is not None and storage.client.client_id, "the SDK registered a client")
        check(storage.tokens is not None and storage.tokens.access_token, "the SDK holds a token")
        print("PASS the SDK found the issuer from the gateway's 401 and metadata, registered, signed in with PKCE and the resource, and got a token")
        tools = await c.list_tools()
        names = sorted(t.name for t in tools.tools)
        check("terraform_plan" in names, names)
        r = await c.call_tool("k8s_get_pod_status", {"namespace": "kube-system"})
        check(r.is_error and "not in the allowlist" in r.content[0].text, r)
        print(f"PASS with its token the SDK lists {names} and is denied where the policy denies")


anyio.run(main)
