// A real OAuth 2.0 token server and a receiver that verifies bearer tokens,
// for test/t/053_bearer_tokens.pl.
//
// The token server is the npm package oauth2-mock-server (RS256 JWTs, a JWKS
// endpoint) over HTTPS with the certificate the test made with openssl; its
// token endpoint is at /<tenant>/oauth2/v2.0/token, where Microsoft Entra
// ID has it.  On top of the package, this script checks the client's
// credentials (HTTP Basic or client_id/client_secret in the form, as RFC
// 6749 2.3.1 allows) against clients.json, answering 401 invalid_client
// otherwise, gives each token the client id (client_id, azp) and, like
// Entra ID, an audience from a scope ending in /.default, and a lifetime
// of `ttl` seconds.  Each token request is logged to token_requests.jsonl.
//
// The receiver (plain HTTP) checks each request's Authorization: Bearer
// token with jose against the token server's JWKS, fetched over HTTPS:
// signature, issuer, expiry, and that its client (and audience) is the one
// the path names: /hook/<client>[/<audience>] (a query string is ignored).  It answers 200, or 401 with
// the reason; Event Grid validation handshakes get their validationResponse
// (only with a valid token).  Each request is logged to
// receiver.jsonl with the token's jti; every token seen is written to
// tokens.txt, so that the test can look for them where they must not be.
//
// Control (GET on the receiver's port): /control/ttl/<s>,
// /control/expires-in/off (answers without expires_in) and /on,
// /control/revoke-next (the next valid token seen is refused from then on),
// /control/token-server/stop, /control/token-server/start.
//
// Usage: node server.js <dir> <token port> <receiver port>; dir holds
// server.pem, server.key, clients.json.  OAUTH_TOKEN_ISSUER, when set, is
// the tokens' iss claim instead of the server's URL (test 077: Azurite takes
// tokens from Entra ID's issuers only; it does not check signatures).
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');
const { OAuth2Server } = require('oauth2-mock-server');
const jose = require('jose');

const [dir, tokenPort, receiverPort] = process.argv.slice(2);
const tenant = '11111111-2222-3333-4444-555555555555';
const clients = JSON.parse(fs.readFileSync(path.join(dir, 'clients.json'), 'utf8'));
const log = (file, o) => fs.appendFileSync(path.join(dir, file), JSON.stringify({ t: Date.now() / 1000, ...o }) + '\n');
let ttl = 3600;
let revokeNext = false;
let sendExpiresIn = true;
const revoked = new Set();

const server = new OAuth2Server(path.join(dir, 'server.key'), path.join(dir, 'server.pem'),
	{ endpoints: { token: `/${tenant}/oauth2/v2.0/token` } });

// who asks: HTTP Basic (each part form-urlencoded, RFC 6749 2.3.1) or the form
function client(req) {
	const h = req.headers.authorization || '';
	if (h.startsWith('Basic ')) {
		const pair = Buffer.from(h.slice(6), 'base64').toString('utf8');
		const i = pair.indexOf(':');
		return { how: 'basic', id: decodeURIComponent(pair.slice(0, i)), secret: decodeURIComponent(pair.slice(i + 1)) };
	}
	return { how: 'body', id: req.body.client_id, secret: req.body.client_secret };
}

server.service.on('beforeTokenSigning', (token, req) => {
	const c = client(req);
	const scope = req.body.scope;
	token.payload.jti = require('crypto').randomUUID();
	token.payload.client_id = c.id;
	token.payload.azp = c.id;
	token.payload.aud = req.body.audience || (scope && scope.endsWith('/.default') ? scope.slice(0, -9) : 'any');
	token.payload.exp = Math.ceil(Date.now() / 1000) + ttl;
	if (process.env.OAUTH_TOKEN_ISSUER)
		token.payload.iss = process.env.OAUTH_TOKEN_ISSUER;
	if (scope && scope.endsWith('/.default'))
		token.payload.roles = ['Events.Send'];
});

server.service.on('beforeResponse', (response, req) => {
	const c = client(req);
	// clients echo-plain, echo-url and echo-basic: refused with an error text
	// that quotes the secret as it came, form-urlencoded, or the Basic header's base64
	if (c.id && c.id.startsWith('echo-')) {
		const form = { 'echo-plain': c.secret, 'echo-url': encodeURIComponent(c.secret),
			'echo-basic': (req.headers.authorization || '').slice(6) }[c.id];
		response.statusCode = 401;
		response.body = { error: 'invalid_client', error_description: 'you sent ' + form };
		return;
	}
	const ok = c.id !== undefined && clients[c.id] !== undefined && clients[c.id] === c.secret;
	log('token_requests.jsonl', { client_id: c.id || null, how: c.how, grant_type: req.body.grant_type,
		scope: req.body.scope || null, audience: req.body.audience || null, ok });
	if (!ok) {
		response.statusCode = 401;
		response.body = { error: 'invalid_client', error_description: 'Client authentication failed for ' + (c.id || '(none)') };
		return;
	}
	if (sendExpiresIn)
		response.body.expires_in = ttl;
	else
		delete response.body.expires_in;
});

let issuer;
let jwks;

async function verify(req, url) {
	const h = req.headers.authorization || '';
	if (!h.startsWith('Bearer '))
		return { ok: false, reason: 'no bearer token' };
	const token = h.slice(7);
	fs.appendFileSync(path.join(dir, 'tokens.txt'), token + '\n');
	const [, , client, audience] = url.split('?')[0].split('/');
	try {
		const { payload } = await jose.jwtVerify(token, jwks, { issuer, audience: audience ? decodeURIComponent(audience) : undefined });
		if (payload.client_id !== client)
			return { ok: false, reason: `token of client ${payload.client_id}, not ${client}`, jti: payload.jti };
		if (revokeNext) {
			revokeNext = false;
			revoked.add(payload.jti);
		}
		if (revoked.has(payload.jti))
			return { ok: false, reason: 'revoked', jti: payload.jti };
		return { ok: true, jti: payload.jti, exp: payload.exp, client: payload.client_id, aud: payload.aud };
	} catch (e) {
		return { ok: false, reason: e.code || e.message };
	}
}

const receiver = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', async () => {
		const url = req.url;
		if (url.startsWith('/control/')) {
			const parts = url.split('/');
			if (parts[2] === 'ttl') ttl = Number(parts[3]);
			else if (parts[2] === 'expires-in') sendExpiresIn = parts[3] === 'on';
			else if (parts[2] === 'revoke-next') revokeNext = true;
			else if (parts[2] === 'token-server' && parts[3] === 'stop') await server.stop();
			else if (parts[2] === 'token-server' && parts[3] === 'start') {
				await server.start(Number(tokenPort), '127.0.0.1');
				server.issuer.url = `https://127.0.0.1:${tokenPort}`;
			}
			res.writeHead(200).end('ok\n');
			return;
		}
		const body = Buffer.concat(chunks).toString('utf8');
		const v = await verify(req, url);
		let events = [];
		try { const b = JSON.parse(body); events = Array.isArray(b) ? b : [b]; } catch (e) { /* not JSON */ }
		const validation = events.length === 1 && events[0].eventType === 'Microsoft.EventGrid.SubscriptionValidationEvent';
		log('receiver.jsonl', { path: url, status: v.ok ? 200 : 401, reason: v.reason || null, jti: v.jti || null,
			client: v.client || null, aud: v.aud || null, exp: v.exp || null, validation,
			ids: events.map((e) => e.id) });
		if (!v.ok) {
			res.writeHead(401, { 'Content-Type': 'application/json' }).end(JSON.stringify({ error: v.reason }));
			return;
		}
		if (validation) {
			res.writeHead(200, { 'Content-Type': 'application/json' })
				.end(JSON.stringify({ validationResponse: events[0].data.validationCode }));
			return;
		}
		res.writeHead(200).end();
	});
});

(async () => {
	await server.issuer.keys.generate('RS256');
	server.issuer.url = `https://127.0.0.1:${tokenPort}`;	// the package would name localhost
	await server.start(Number(tokenPort), '127.0.0.1');
	issuer = server.issuer.url;
	jwks = jose.createRemoteJWKSet(new URL(issuer + '/jwks'));
	receiver.keepAliveTimeout = 60000;
	receiver.listen(Number(receiverPort), '127.0.0.1', () => {
		fs.writeFileSync(path.join(dir, 'ready'), issuer + '\n');
	});
})().catch((e) => { console.error(e); process.exit(1); });
