/*
 * token_request.c - the token request (SPEC section 12; RFC 6749 section
 * 4.4): the client-credentials POST a delivery worker sends through its
 * HTTP thread, the answer read with PostgreSQL's jsonb, and the blocking
 * form the upkeep worker's handshakes use (eg_token_get_now).  token.c
 * keeps the tokens in shared memory; the file comment there says how.
 */
#include "http/token.h"

#include "common/base64.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include <curl/curl.h>

/* s, form-urlencoded (libcurl's escaping), appended to buf. */
static void
append_escaped(StringInfo buf, const char *s)
{
	char	   *e = curl_easy_escape(NULL, s, (int) strlen(s));

	if (e == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory")));
	appendStringInfoString(buf, e);
	curl_free(e);
}

/*
 * Makes req the token request of credentials c (on the main thread): its
 * url (c's, which must outlive the request), a malloc'd body and header
 * block, both holding the secret (http.c clears them when the request
 * ends), and room for the whole answer.
 */
void
eg_token_request_prepare(EgRequest *req, const EgCredentials *c)
{
	StringInfoData body;
	StringInfoData lines;
	int			n = 2;
	bool		basic = strcmp(c->method, "entra") != 0;

	initStringInfo(&body);
	appendStringInfoString(&body, "grant_type=client_credentials");
	if (c->scope != NULL && c->scope[0] != '\0')
	{
		appendStringInfoString(&body, "&scope=");
		append_escaped(&body, c->scope);
	}
	if (c->audience != NULL && c->audience[0] != '\0')
	{
		appendStringInfoString(&body, "&audience=");
		append_escaped(&body, c->audience);
	}
	if (!basic)
	{
		appendStringInfoString(&body, "&client_id=");
		append_escaped(&body, c->client_id);
		appendStringInfoString(&body, "&client_secret=");
		append_escaped(&body, c->client_secret);
	}

	initStringInfo(&lines);
	appendStringInfoString(&lines, "Content-Type: application/x-www-form-urlencoded");
	appendStringInfoChar(&lines, '\0');
	appendStringInfoString(&lines, "Accept: application/json");
	appendStringInfoChar(&lines, '\0');
	if (basic)
	{
		/* RFC 6749 2.3.1: both form-urlencoded, then user:password in Basic */
		StringInfoData pair;
		int			enc_len;
		char	   *enc;

		initStringInfo(&pair);
		append_escaped(&pair, c->client_id);
		appendStringInfoChar(&pair, ':');
		append_escaped(&pair, c->client_secret);
		enc_len = pg_b64_enc_len(pair.len);
		enc = palloc(enc_len + 1);
		enc_len = eg_b64_encode((const uint8 *) pair.data, pair.len, enc, enc_len);
		if (enc_len < 0)
			elog(ERROR, "eventgrid: could not encode the client credentials");
		appendStringInfoString(&lines, "Authorization: Basic ");
		appendBinaryStringInfo(&lines, enc, enc_len);
		appendStringInfoChar(&lines, '\0');
		n++;
		explicit_bzero(pair.data, pair.len);
		explicit_bzero(enc, enc_len);
		pfree(pair.data);
		pfree(enc);
	}

	memset(req, 0, sizeof(EgRequest));
	req->url = c->token_endpoint;
	req->token_request = true;
	req->answer_max = EG_TOKEN_ANSWER_MAX;
	req->body = malloc(body.len + 1);
	if (req->body == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory")));
	memcpy(req->body, body.data, body.len + 1);
	req->body_len = body.len;
	eg_http_set_headers(req, lines.data, lines.len, n);
	explicit_bzero(body.data, body.len);
	explicit_bzero(lines.data, lines.len);
	pfree(body.data);
	pfree(lines.data);
}

/* A string member of a JSON object (NULL: absent or not a string), NUL-terminated, palloc'd. */
static char *
json_string(Jsonb *jb, const char *key)
{
	JsonbValue	v;

	if (getKeyJsonValueFromContainer(&jb->root, key, strlen(key), &v) == NULL || v.type != jbvString)
		return NULL;
	return pnstrdup(v.val.string.val, v.val.string.len);
}

/* RFC 6750 2.1 b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" */
static bool
is_b64token(const char *s, int len)
{
	int			i = 0;

	while (i < len && (isalnum((unsigned char) s[i]) || strchr("-._~+/", s[i]) != NULL) && s[i] != '\0')
		i++;
	if (i == 0)
		return false;
	while (i < len && s[i] == '=')
		i++;
	return i == len;
}

/* Does text hold base64 of id:secret (RFC 7617's pair), palloc'd here? */
static bool
holds_basic_pair(const char *text, StringInfo pair)
{
	int			enc_len = pg_b64_enc_len(pair->len);
	char	   *enc = palloc(enc_len + 1);
	bool		found;

	enc_len = eg_b64_encode((const uint8 *) pair->data, pair->len, enc, enc_len);
	enc[Max(enc_len, 0)] = '\0';
	/* without its padding: a quote may stop at the last full group */
	while (enc_len > 0 && enc[enc_len - 1] == '=')
		enc[--enc_len] = '\0';
	found = enc_len > 0 && strstr(text, enc) != NULL;
	explicit_bzero(enc, enc_len);
	pfree(enc);
	return found;
}

/*
 * Does text quote credentials c's client secret in any form the token
 * request sent it in: as it is, form-urlencoded (the body of an Entra
 * request), or inside the base64 of the Basic credentials (id:secret,
 * escaped as RFC 6749 2.3.1 says, and unescaped as other clients send it)?
 */
static bool
quotes_secret(const char *text, const EgCredentials *c)
{
	StringInfoData f;
	bool		found;

	if (c->client_secret[0] == '\0')
		return false;
	if (strstr(text, c->client_secret) != NULL)
		return true;
	initStringInfo(&f);
	append_escaped(&f, c->client_secret);
	found = strstr(text, f.data) != NULL;
	resetStringInfo(&f);
	append_escaped(&f, c->client_id);
	appendStringInfoChar(&f, ':');
	append_escaped(&f, c->client_secret);
	found = found || holds_basic_pair(text, &f);
	resetStringInfo(&f);
	appendStringInfo(&f, "%s:%s", c->client_id, c->client_secret);
	found = found || holds_basic_pair(text, &f);
	explicit_bzero(f.data, f.len);
	pfree(f.data);
	return found;
}

/*
 * The secret must never be quoted, in any form the request sent it in
 * (quotes_secret()): a description that holds one is left out.
 */
static void
describe_error(char *error, size_t errlen, const EgCredentials *c, int status, Jsonb *jb)
{
	char	   *code = jb ? json_string(jb, "error") : NULL;
	char	   *desc = jb ? json_string(jb, "error_description") : NULL;
	char	   *text;

	if (code == NULL)
		text = psprintf("token endpoint %s answered HTTP %d", c->token_endpoint, status);
	else if (desc == NULL)
		text = psprintf("token endpoint %s answered HTTP %d: %s", c->token_endpoint, status, code);
	else
		text = psprintf("token endpoint %s answered HTTP %d: %s (%s)", c->token_endpoint, status, code, desc);
	if (quotes_secret(text, c))
		text = psprintf("token endpoint %s answered HTTP %d (its error text quoted the client secret: left out)",
						c->token_endpoint, status);
	text = eg_printable_copy(text, (int) strlen(text));
	strlcpy(error, text, errlen);
}

/*
 * Reads the answer of token request req for credentials c: true with the
 * access token (palloc'd, *len bytes) and its lifetime in seconds; false
 * with why not in error (printable, never the secret or a token).
 */
bool
eg_token_answer(const EgCredentials *c, const EgRequest *req, char **token, int *len,
				int64 *expires_in_s, char *error, size_t errlen)
{
	Jsonb	   *jb;
	char	   *access;
	char	   *type;
	JsonbValue	v;

	*token = NULL;
	*len = 0;
	*expires_in_s = EG_TOKEN_DEFAULT_LIFETIME_S;
	if (req->transport != EG_TRANSPORT_OK)
	{
		snprintf(error, errlen, "token request to %s failed: %s", c->token_endpoint,
				 req->errbuf[0] ? req->errbuf : eg_outcome_name(eg_outcome_of(req->transport, 0)));
		return false;
	}
	jb = eg_json_object(req->answer ? req->answer : "", req->answer_len);
	if (req->http_status != 200)
	{
		describe_error(error, errlen, c, req->http_status, jb);
		return false;
	}
	if (req->answer_len >= req->answer_max)
	{
		snprintf(error, errlen, "token endpoint %s answered more than %d bytes", c->token_endpoint,
				 EG_TOKEN_ANSWER_MAX);
		return false;
	}
	if (jb == NULL)
	{
		snprintf(error, errlen, "token endpoint %s answered HTTP 200 without a JSON object", c->token_endpoint);
		return false;
	}
	access = json_string(jb, "access_token");
	if (access == NULL || !is_b64token(access, (int) strlen(access)) || strlen(access) > EG_TOKEN_MAX_BYTES)
	{
		snprintf(error, errlen, "token endpoint %s answered without a usable access_token (%s)",
				 c->token_endpoint, access == NULL ? "absent or not a string"
				 : strlen(access) > EG_TOKEN_MAX_BYTES ? "longer than 16384 bytes"
				 : "not a bearer token's characters");
		return false;
	}
	type = json_string(jb, "token_type");
	if (type != NULL && pg_strcasecmp(type, "Bearer") != 0)
	{
		snprintf(error, errlen, "token endpoint %s answered token_type \"%s\", not Bearer", c->token_endpoint,
				 eg_printable_copy(type, (int) Min(strlen(type), 40)));
		return false;
	}
	if (getKeyJsonValueFromContainer(&jb->root, "expires_in", 10, &v) != NULL)
	{
		int64		s = -1;
		char	   *text = v.type == jbvNumeric
			? DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(v.val.numeric)))
			: v.type == jbvString ? pnstrdup(v.val.string.val, v.val.string.len) : NULL;
		char	   *end = NULL;

		if (text != NULL)
		{
			errno = 0;
			s = strtoll(text, &end, 10);
			if (errno != 0 || end == text || *end != '\0')
				s = -1;
		}
		if (s <= 0)
		{
			snprintf(error, errlen, "token endpoint %s answered an expires_in that is not a positive whole number",
					 c->token_endpoint);
			return false;
		}
		*expires_in_s = Min(s, (int64) 366 * 86400);
	}
	*token = access;
	*len = (int) strlen(access);
	return true;
}

/*
 * A token for credentials c now, for a process that may wait (the upkeep
 * worker's handshakes): the shared one, or one asked for here with a
 * blocking request (at most eventgrid.response_timeout), or, when another
 * process is asking, its answer.  False with out->error when none can be
 * had.
 */
bool
eg_token_get_now(const EgCredentials *c, const char *ca_file, EgToken *out)
{
	TimestampTz give_up = GetCurrentTimestamp() + (TimestampTz) (eg_response_timeout_ms + 5000) * 1000;

	for (;;)
	{
		EgTokenState state = eg_token_lookup(c, out, false);	/* the workers renew */
		EgRequest	req;
		char	   *token;
		int			len;
		int64		expires_in;

		if (state == EG_TOKEN_READY)
			return true;
		if (state == EG_TOKEN_FAILED)
			return false;
		if (state == EG_TOKEN_FETCHING)
		{
			if (GetCurrentTimestamp() >= give_up)
			{
				snprintf(out->error, sizeof(out->error), "no token: the token request of another worker took too long");
				return false;
			}
			pg_usleep(10 * 1000L);
			CHECK_FOR_INTERRUPTS();
			continue;
		}
		eg_token_request_prepare(&req, c);
		eg_http_perform(&req, ca_file, eg_response_timeout_ms);
		eg_http_end_token_request(&req);
		if (!eg_token_answer(c, &req, &token, &len, &expires_in, out->error, sizeof(out->error)))
		{
			eg_token_failed(c, out->error);
			free(req.answer);
			return false;
		}
		eg_token_store(c, token, len, expires_in, out);
		explicit_bzero(token, len);
		pfree(token);
		free(req.answer);
		if (out->len > 0)
			return true;	/* the copy: the slot may be another's by the next look */
	}
}
