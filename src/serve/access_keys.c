/*
 * access_keys.c - the checks of a topic's access keys on Event Grid's data
 * plane (SPEC 16), for eventgrid._http_publish(): a key compared in
 * constant time, and a shared access signature (SAS token) verified with
 * HMAC-SHA256 (PostgreSQL's pg_hmac) under either key.  A SAS token is
 * "r={resource}&e={expiry}&s={signature}", each part percent-encoded (the
 * Azure SDKs' generate_sas()); the signature covers "r=...&e=..." as sent,
 * with the key base64-decoded.  Percent-decoding is libmicrohttpd's.
 */
#include "core/eventgrid.h"

#include <microhttpd.h>
#include <openssl/crypto.h>

#include "common/base64.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(eventgrid_secret_equal);
PG_FUNCTION_INFO_V1(eventgrid_sas_token_check);

/*
 * SQL: eventgrid._secret_equal(a text, b text) -> boolean.  Whether two
 * secrets are the same, in time that depends on their length only.
 */
Datum
eventgrid_secret_equal(PG_FUNCTION_ARGS)
{
	text	   *a = PG_GETARG_TEXT_PP(0);
	text	   *b = PG_GETARG_TEXT_PP(1);
	size_t		len = VARSIZE_ANY_EXHDR(a);

	if (len != VARSIZE_ANY_EXHDR(b))
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(CRYPTO_memcmp(VARDATA_ANY(a), VARDATA_ANY(b), len) == 0);
}

/* Whether mac is the HMAC-SHA256 of msg under the base64 key b64 (a key that is not base64: no). */
static bool
hmac_matches(const char *b64, const char *msg, const uint8 *mac)
{
	int			b64_len = strlen(b64);
	uint8	   *key = palloc(pg_b64_dec_len(b64_len) + 1);
	int			key_len = eg_b64_decode(b64, b64_len, key, pg_b64_dec_len(b64_len));
	uint8		mine[PG_SHA256_DIGEST_LENGTH];
	pg_hmac_ctx *ctx;
	bool		ok;

	if (key_len <= 0)
		return false;
	ctx = pg_hmac_create(PG_SHA256);
	if (ctx == NULL || pg_hmac_init(ctx, key, key_len) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) msg, strlen(msg)) < 0 ||
		pg_hmac_final(ctx, mine, sizeof(mine)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("eventgrid: could not compute a SAS token's signature: %s", pg_hmac_error(ctx))));
	pg_hmac_free(ctx);
	explicit_bzero(key, key_len);
	pfree(key);
	ok = CRYPTO_memcmp(mine, mac, sizeof(mine)) == 0;
	explicit_bzero(mine, sizeof(mine));
	return ok;
}

/* A percent-encoded part of a token, decoded (libmicrohttpd's unescaping). */
static char *
decoded(const char *start, size_t len)
{
	char	   *s = pnstrdup(start, len);

	s[MHD_http_unescape(s)] = '\0';
	return s;
}

/*
 * SQL: eventgrid._sas_token_check(token text, key1 text, key2 text, OUT
 * resource text, OUT expiry text).  When token is signed with key1 or
 * key2 (base64), the resource and expiry it names, decoded (the caller
 * compares them with the request's path and the clock); else NULLs.  At
 * most 4 kB of token is looked at.
 */
Datum
eventgrid_sas_token_check(PG_FUNCTION_ARGS)
{
	char	   *token = text_to_cstring(PG_GETARG_TEXT_PP(0));
	TupleDesc	desc;
	Datum		values[2] = {0, 0};
	bool		nulls[2] = {true, true};
	char	   *e;
	char	   *s;
	char	   *sig_text;
	uint8		sig[64];
	int			sig_len;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "eventgrid._sas_token_check() must return a row");
	desc = BlessTupleDesc(desc);

	/* r={resource}&e={expiry}&s={signature}: the signature is last, and covers what is before "&s=" */
	s = strlen(token) <= 4096 && strncmp(token, "r=", 2) == 0 ? strstr(token, "&s=") : NULL;
	e = s != NULL ? strstr(token, "&e=") : NULL;
	if (s != NULL && e != NULL && e < s && strstr(s + 3, "&s=") == NULL)
	{
		sig_text = decoded(s + 3, strlen(s + 3));
		sig_len = strlen(sig_text) <= 88 ?
			eg_b64_decode(sig_text, strlen(sig_text), sig, sizeof(sig)) : -1;
		*s = '\0';				/* token: the signed part */
		if (sig_len == PG_SHA256_DIGEST_LENGTH &&
			((!PG_ARGISNULL(1) && hmac_matches(text_to_cstring(PG_GETARG_TEXT_PP(1)), token, sig)) ||
			 (!PG_ARGISNULL(2) && hmac_matches(text_to_cstring(PG_GETARG_TEXT_PP(2)), token, sig))))
		{
			values[0] = CStringGetTextDatum(decoded(token + 2, e - token - 2));
			values[1] = CStringGetTextDatum(decoded(e + 3, strlen(e + 3)));
			nulls[0] = nulls[1] = false;
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
