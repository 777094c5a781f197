"""The remote MCP client a developer's agent is, for scripts/readme-check.sh's
team part: it reaches the gateway at the URL `gateway client install
claude-code --url` wrote in ~/.claude.json, with the official MCP Python
SDK's own OAuth client (no token handed in: from the gateway's 401 it finds
the provider, registers itself, and signs its person in with PKCE and the
resource indicator), trusting the system's certificate store, and calls the
tools.

    python readme-team-client.py PERSON request    plan, ask to apply: prints APPROVAL <id>
    python readme-team-client.py PERSON apply ID   apply with the approval: prints APPLIED

The person's sign-in at the provider's pages is played by tests/oidc/login.py
(what their browser would do).
"""

import json
import os
import ssl
import sys

import anyio
import httpx2
from mcp import Client, types
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oidc"))
from login import Memory, authorize  # noqa: E402

MODULE = "terraform/offline-demo"
REDIRECT = "http://127.0.0.1:53683/callback"


def structured(result):
    if result.is_error:
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        raise SystemExit(f"the call failed: {text}")
    return result.structured_content or {}


async def main(person, argv):
    with open(os.path.expanduser("~/.claude.json")) as f:
        entry = json.load(f)["mcpServers"]["gateway"]
    assert entry.get("type") == "http" and entry.get("url", "").startswith("https://"), entry
    assert set(entry) <= {"type", "url"}, f"nothing but the address in the entry: {entry}"
    url = entry["url"]
    trust = ssl.create_default_context()
    back = {}

    async def redirect_handler(address: str) -> None:
        def sign_in():
            with httpx2.Client(verify=trust, follow_redirects=False, timeout=30) as http:
                return authorize(http, address, REDIRECT, person)

        back.update(await anyio.to_thread.run_sync(sign_in))

    async def callback_handler() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(
            code=back["code"][0],
            state=back.get("state", [None])[0],
            iss=back.get("iss", [None])[0],
        )

    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="readme-check agent",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
            scope="openid email groups mcp",
        ),
        storage=Memory(),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    http = httpx2.AsyncClient(auth=auth, verify=trust, timeout=httpx2.Timeout(30, read=600))
    info = types.Implementation(name="readme-check-agent", version="1")
    async with Client(streamable_http_client(url, http_client=http), client_info=info) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"terraform_plan", "terraform_apply"} <= names, names
        if argv[0] == "request":
            plan = structured(await c.call_tool("terraform_plan", {"working_dir": MODULE}))
            assert plan.get("status") == "completed", plan
            asked = structured(await c.call_tool("terraform_apply", {"working_dir": MODULE}))
            assert asked.get("status") == "pending_approval", asked
            print("APPROVAL", asked["approval_id"], flush=True)
        elif argv[0] == "apply":
            done = structured(
                await c.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": argv[1]})
            )
            assert done.get("status") == "completed" and done.get("ok") is True, done
            print("APPLIED", json.dumps(done.get("summary", "")), flush=True)
        else:
            raise SystemExit(__doc__)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1], sys.argv[2:])
