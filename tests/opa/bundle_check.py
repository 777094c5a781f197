"""Signed policy bundles checked with OPA's own Go code (PyPI
opa-golib-python-bindings: OPA's engine and its built-in functions). Run by
tests/policy_bundle.rs:

    python bundle_check.py check BUNDLE PUBLIC_KEY_PEM
    python bundle_check.py make OUT_BUNDLE POLICY_DIR

`check`: a bundle the gateway built and signed, verified the way OPA's
bundle reader does it, with OPA's code: the JWT's signature with OPA's
`io.jwt.decode_verify` (OPA's JOSE library), every file's digest with OPA's
`crypto.sha256` over OPA's canonical JSON (`json.marshal` of the parsed
document: keys sorted, numbers as written; the bundle hasher differs only
in not HTML-escaping `<`, `>`, `&`, which is undone here), every file
listed and every listed file present.

`make`: a bundle laid out as `opa build` writes one (names with a leading
`/`, one merged `/data.json`, a `/.manifest`), its digests computed and its
JWT signed by OPA's code (`io.jwt.encode_sign`) with an ES256 key made
here; prints the public key's PEM path. What cannot run here is the `opa`
binary itself (no Go toolchain can be fetched): its `build`/`sign` commands
are reproduced from OPA's own functions and documented layout.
"""
import io
import json
import os
import sys
import tarfile

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from opa_bindings import OpaEngine

POLICY = r'''
package bundlecheck

structured(name) if {
    parts := split(name, "/")
    parts[count(parts) - 1] in {"data.json", "data.yaml", ".manifest"}
}

canonical(text) := s if {
    m := json.marshal(json.unmarshal(text))
    s := replace(replace(replace(m, "\\u003c", "<"), "\\u003e", ">"), "\\u0026", "&")
}

digests[name] := crypto.sha256(canonical(text)) if {
    some name, text in input.files
    structured(name)
}

digests[name] := crypto.sha256(text) if {
    some name, text in input.files
    not structured(name)
}

verified := io.jwt.decode_verify(input.token, {"cert": input.cert})

token := io.jwt.encode_sign(input.header, input.payload, input.jwk)
'''


def engine():
    e = OpaEngine()
    e.add_policy("bundlecheck.rego", POLICY)
    return e


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def read_tar(path):
    out = {}
    with tarfile.open(path, "r:gz") as t:
        for m in t.getmembers():
            if m.isfile():
                out[m.name.lstrip("/").removeprefix("./")] = t.extractfile(m).read().decode()
    return out


def check_ours(bundle, public_pem):
    files = read_tar(bundle)
    sig = json.loads(files.pop(".signatures.json"))
    check(len(sig["signatures"]) == 1, sig)
    token = sig["signatures"][0]
    e = engine()
    ok, header, payload = e.eval_document(
        "bundlecheck.verified", {"token": token, "cert": open(public_pem).read()})
    check(ok is True, "OPA's io.jwt.decode_verify refused the gateway's signature")
    check(header["alg"] == "ES256" and header["kid"] == "team-key", header)
    digests = e.eval_document("bundlecheck.digests", {"files": files})
    listed = {f["name"]: f for f in payload["files"]}
    check(set(listed) == set(files), (sorted(listed), sorted(files)))
    for name, f in listed.items():
        check(f["algorithm"] == "SHA-256", f)
        check(f["hash"] == digests[name], f"{name}: signed {f['hash']}, OPA computes {digests[name]}")
    print(f"PASS OPA's code verifies the gateway's bundle: signature and {len(files)} digests")


def make_opa(out, policy_dir):
    key = ec.generate_private_key(ec.SECP256R1())
    nums = key.private_numbers()

    def b64(n):
        import base64
        return base64.urlsafe_b64encode(n.to_bytes(32, "big")).rstrip(b"=").decode()

    jwk = {"kty": "EC", "crv": "P-256", "x": b64(nums.public_numbers.x),
           "y": b64(nums.public_numbers.y), "d": b64(nums.private_value)}
    files, data = {}, {}
    for root, dirs, names in os.walk(policy_dir):
        dirs.sort()
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(root, n), policy_dir)
            if n.endswith(".rego"):
                files[rel] = open(os.path.join(root, n)).read()
            elif n in ("data.yaml", "data.yml", "data.json") and not rel.startswith("schema/"):
                doc = yaml.safe_load(open(os.path.join(root, n))) if not n.endswith("json") \
                    else json.load(open(os.path.join(root, n)))
                node = data
                for part in os.path.dirname(rel).split(os.sep):
                    if part:
                        node = node.setdefault(part, {})
                node.update(doc)
    # As `opa build` writes them: one merged data.json, a manifest.
    files["data.json"] = json.dumps(data)
    files[".manifest"] = json.dumps({"revision": "made-by-opa-code", "roots": [""]})
    e = engine()
    digests = e.eval_document("bundlecheck.digests", {"files": files})
    payload = {"files": [{"name": n, "hash": digests[n], "algorithm": "SHA-256"} for n in sorted(files)]}
    token = e.eval_document("bundlecheck.token", {
        "header": {"alg": "ES256", "kid": "opa-key"}, "payload": payload, "jwk": jwk})
    files[".signatures.json"] = json.dumps({"signatures": [token]}, indent=1)
    with tarfile.open(out, "w:gz") as t:
        for name in sorted(files):
            body = files[name].encode()
            info = tarfile.TarInfo("/" + name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    pub = out + ".pub.pem"
    open(pub, "wb").write(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    print(pub)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check_ours(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "make":
        make_opa(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: bundle_check.py check BUNDLE PUB | make OUT DIR")
