/*
 * signing.c - Standard Webhooks signatures (standard-webhooks spec v1.0.0)
 * of the requests of a signed event subscription: the headers
 * webhook-id, webhook-timestamp and webhook-signature, the last one
 * "v1,<base64 of HMAC-SHA256(key, id "." timestamp "." body)>" for each of
 * its keys (the current secret and, during a rotation, the previous one),
 * space-separated.  PostgreSQL's own HMAC (common/hmac.h) and base64
 * (common/base64.h) do the work; the secrets come from
 * eventgrid.signing_secrets through the claim and are never logged.
 */
#include "http/signing.h"

#include <time.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "fmgr.h"
#include "utils/builtins.h"

/*
 * The message id of a request of event subscription subscription_id
 * carrying the events whose store ids (eventgrid.events.id) are
 * ids[0..n): "msg_<subscription id>_<event id>" for one event, and for a
 * batch "msg_" and the first 32 hex digits of the SHA-256 of the
 * subscription id and the event ids.  The same for every retry of the same
 * content, so a receiver can deduplicate, and different for each
 * subscription, so one receiver behind two subscriptions drops neither
 * message (Standard Webhooks: a message id per message).  Returns a
 * palloc'd string.
 */
char *
eg_webhook_id(int64 subscription_id, const int64 *ids, int n)
{
	pg_cryptohash_ctx *ctx;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		hex[33];

	if (n == 1)
		return psprintf("msg_" INT64_FORMAT "_" INT64_FORMAT, subscription_id, ids[0]);
	ctx = pg_cryptohash_create(PG_SHA256);
	if (ctx == NULL || pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) &subscription_id, sizeof(int64)) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) ids, sizeof(int64) * n) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("eventgrid: could not hash a batch's event ids: %s", pg_cryptohash_error(ctx))));
	pg_cryptohash_free(ctx);
	hex_encode((const char *) digest, 16, hex);
	hex[32] = '\0';
	return psprintf("msg_%s", hex);
}

/*
 * Appends "v1,<base64 HMAC-SHA256>" of prefix and body, one after the other,
 * with the key of secret ("whsec_<base64>").
 */
static void
append_signature(StringInfo out, const char *secret, const char *prefix, const char *body, size_t body_len)
{
	const char *b64 = secret + 6;	/* after "whsec_" (checked in SQL) */
	int			b64_len = strlen(b64);
	uint8	   *key = palloc(pg_b64_dec_len(b64_len));
	int			key_len = eg_b64_decode(b64, b64_len, key, pg_b64_dec_len(b64_len));
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	char		mac_b64[64];
	int			mac_b64_len;
	pg_hmac_ctx *ctx;

	if (key_len <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("eventgrid: a signing secret in eventgrid.signing_secrets is not valid base64")));
	ctx = pg_hmac_create(PG_SHA256);
	if (ctx == NULL || pg_hmac_init(ctx, key, key_len) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) prefix, strlen(prefix)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) body, body_len) < 0 ||
		pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("eventgrid: could not compute a webhook signature: %s", pg_hmac_error(ctx))));
	pg_hmac_free(ctx);
	explicit_bzero(key, key_len);
	pfree(key);
	mac_b64_len = eg_b64_encode(mac, sizeof(mac), mac_b64, sizeof(mac_b64));
	appendStringInfoString(out, "v1,");
	appendBinaryStringInfo(out, mac_b64, mac_b64_len);
}

/*
 * Fills sig with the headers' values for a request with message id
 * webhook_id and body body[0..body_len), signed with keys (the subscription's
 * secrets, space-separated: the current one, then a previous one still
 * valid).  The timestamp is the real clock's, not the workers' (with
 * eventgrid.clock_offset), since receivers check it against theirs.
 */
void
eg_sign_request(EgSignature *sig, const char *keys, const char *webhook_id,
				const char *body, size_t body_len)
{
	char	   *prefix;
	char	   *copy = pstrdup(keys);
	char	   *save = NULL;

	snprintf(sig->timestamp, sizeof(sig->timestamp), INT64_FORMAT, (int64) time(NULL));
	/* signed: "<id>.<timestamp>." and the body, fed to the HMAC without a copy of the body */
	prefix = psprintf("%s.%s.", webhook_id, sig->timestamp);
	initStringInfo(&sig->signature);
	for (char *k = strtok_r(copy, " ", &save); k; k = strtok_r(NULL, " ", &save))
	{
		if (sig->signature.len > 0)
			appendStringInfoChar(&sig->signature, ' ');
		append_signature(&sig->signature, k, prefix, body, body_len);
	}
	explicit_bzero(copy, strlen(copy));
	pfree(copy);
	pfree(prefix);
}

PG_FUNCTION_INFO_V1(eventgrid_random_bytes);

/*
 * SQL: eventgrid._random_bytes(n integer) -> bytea: n (1 to 1024) bytes
 * from pg_strong_random(), for generated signing secrets.  22023 outside
 * that range; an error if the source fails.
 */
Datum
eventgrid_random_bytes(PG_FUNCTION_ARGS)
{
	int32		n = PG_GETARG_INT32(0);
	bytea	   *result;

	if (n < 1 || n > 1024)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the number of random bytes must be between 1 and 1024, got %d", n)));
	result = palloc(VARHDRSZ + n);
	SET_VARSIZE(result, VARHDRSZ + n);
	if (!pg_strong_random(VARDATA(result), n))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate %d random bytes", n)));
	PG_RETURN_BYTEA_P(result);
}
