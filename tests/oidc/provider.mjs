// The OpenID Connect provider the gateway's SSO tests start: the certified
// `oidc-provider` package (npm), configured from a JSON file, serving HTTPS
// with a certificate the test made. Not a mock: discovery, JWKS, the
// authorization-code flow with PKCE, the client-credentials grant, token
// revocation, resource indicators (RFC 8707) and JWT access tokens (RFC
// 9068) are the package's own.
//
//   node tests/oidc/provider.mjs CONFIG.json
//
// CONFIG: {"issuer", "port", "host" (default 127.0.0.1), "tls": {"cert", "key"}, "keys": [PEM paths,
// the first signs], "resource", "other_resources", "opaque_resources" (given opaque
// tokens, checked by introspection), "users": {"login": {"email", "groups"}},
// "clients": [client metadata], "access_token_ttl"}. Prints one line,
// "oidc-provider: ready <issuer>", once it listens.
//
// Sign-in is the package's development interaction (any password; the login
// must be a configured user, else the account is not found).
import { readFileSync } from 'node:fs';
import { createPrivateKey } from 'node:crypto';
import https from 'node:https';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const jwks = {
  keys: config.keys.map((path, i) => {
    const jwk = createPrivateKey(readFileSync(path)).export({ format: 'jwk' });
    return { ...jwk, kid: config.kids ? config.kids[i] : `key-${i}`, use: 'sig' };
  }),
};
const alg = (jwk) => (jwk.kty === 'EC' ? 'ES256' : jwk.kty === 'OKP' ? 'EdDSA' : 'RS256');

const users = config.users;
const provider = new Provider(config.issuer, {
  clients: config.clients.map((c) => ({ id_token_signed_response_alg: alg(jwks.keys[0]), ...c })),
  jwks,
  // Every signing algorithm the keys make, for ID tokens and access tokens.
  enabledJWA: { idTokenSigningAlgValues: ['ES256', 'RS256', 'EdDSA'] },
  findAccount(ctx, id) {
    const user = users[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: user.email, email_verified: true, groups: user.groups };
      },
    };
  },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
  scopes: ['openid', 'offline_access', 'email', 'groups', 'mcp'],
  // Clients that register themselves (MCP clients do, RFC 7591) sign with
  // the algorithm the keys make.
  clientDefaults: {
    grant_types: ['authorization_code'],
    id_token_signed_response_alg: alg(jwks.keys[0]),
    response_types: ['code'],
    token_endpoint_auth_method: 'none',
  },
  features: {
    devInteractions: { enabled: true },
    registration: { enabled: true },
    deviceFlow: { enabled: true },
    // A confidential client's own tokens (a remote upstream's grant), and
    // their revocation (RFC 7009).
    clientCredentials: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => config.resource,
      useGrantedResource: () => true,
      getResourceServerInfo(ctx, resourceIndicator) {
        if (resourceIndicator !== config.resource && !(config.other_resources || []).includes(resourceIndicator)) {
          throw new Provider.errors.InvalidTarget();
        }
        return {
          scope: 'mcp',
          audience: resourceIndicator,
          accessTokenTTL: config.access_token_ttl || 300,
          // A resource that checks tokens by introspection gets opaque
          // ones (the package revokes only those).
          accessTokenFormat: (config.opaque_resources || []).includes(resourceIndicator) ? 'opaque' : 'jwt',
          jwt: { sign: { alg: alg(jwks.keys[0]) } },
        };
      },
    },
  },
  // The claims a resource server needs in the access token itself.
  async extraTokenClaims(ctx, token) {
    const user = users[token.accountId];
    if (!user) return undefined;
    return { email: user.email, groups: user.groups };
  },
  pkce: { required: () => true },
  ttl: { AccessToken: config.access_token_ttl || 300 },
});
provider.proxy = false;
// A failure of the provider itself is said on stderr (the page hides it).
provider.on('server_error', (ctx, err) => process.stderr.write(`oidc-provider: server_error: ${err.stack}\n`));

const server = https.createServer(
  { cert: readFileSync(config.tls.cert), key: readFileSync(config.tls.key) },
  provider.callback(),
);
server.listen(config.port, config.host || '127.0.0.1', () => {
  process.stdout.write(`oidc-provider: ready ${config.issuer}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
