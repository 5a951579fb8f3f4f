/*
 * storage_queue.c - the StorageQueue destination (SPEC 21): Azure Queue
 * Storage's Put Message, through libcurl like a webhook's POST.
 *
 * The endpoint is the queue's URL: https://{account}.queue.core.windows.net/{queue}
 * (the account is the host's first label) or, path-style as emulators
 * such as Azurite serve it, http://127.0.0.1:10001/{account}/{queue};
 * queueMessageTimeToLiveInSeconds=N in its query becomes Put Message's
 * messagettl.  A SAS token (the rest of the query the subscription was
 * given) or the account's key is kept apart (destination_credentials) and
 * handed in here: a SAS token goes in the request's query, a key signs the
 * request (Authorization: SharedKey, HMAC-SHA256 by PostgreSQL's HMAC over
 * the string Azure Storage's "Authorize with Shared Key" defines); with
 * neither, the subscription's bearer token (Microsoft Entra ID) is sent as
 * for a webhook.  The message is the event's JSON in the delivery schema,
 * base64-encoded in <QueueMessage><MessageText>.
 */
#include "http/storage_queue.h"

#include "common/base64.h"
#include "core/compat.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#include <time.h>

#include <curl/curl.h>

bool
eg_storage_credentials_refused(void *easy)
{
#if LIBCURL_VERSION_NUM >= 0x075300
	struct curl_header *h = NULL;

	return curl_easy_header((CURL *) easy, "x-ms-error-code", 0, CURLH_HEADER, -1, &h) == CURLHE_OK &&
		h != NULL && strcmp(h->value, "AuthenticationFailed") == 0;
#else
	return false;				/* libcurl before 7.83 reads no header back: 403 stays Forbidden */
#endif
}

/* The Queue service version the requests speak (Put Message with messagettl -1 needs 2017-07-29). */
#define EG_STORAGE_VERSION "2019-12-12"

/*
 * Parses a StorageQueue endpoint (as stored: no SAS token) into *q:
 * account and queue from the host or the path, the message time to live;
 * NULL, or why not (a static string).
 */
const char *
eg_storage_parse(const char *endpoint, EgStorageQueue *q)
{
	CURLU	   *h = curl_url();
	char	   *host = NULL,
			   *path = NULL,
			   *query = NULL;
	const char *problem = NULL;

	memset(q, 0, sizeof(EgStorageQueue));
	q->ttl_s = 0;
	if (h == NULL)
		return "out of memory";
	if (curl_url_set(h, CURLUPART_URL, endpoint, 0) != CURLUE_OK ||
		curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
		curl_url_get(h, CURLUPART_PATH, &path, 0) != CURLUE_OK)
		problem = "libcurl cannot parse it as a URL";
	else
	{
		char	   *slash = strchr(path + 1, '/');

		if (slash == NULL)
		{
			/* https://{account}.queue.core.windows.net/{queue} */
			size_t		n = strcspn(host, ".");

			if (n == 0 || n >= sizeof(q->account) || strlen(path + 1) >= sizeof(q->queue))
				problem = "the URL names no account and queue";
			else
			{
				memcpy(q->account, host, n);
				q->account[n] = '\0';
				strcpy(q->queue, path + 1);
			}
		}
		else if ((size_t) (slash - path - 1) >= sizeof(q->account) || strlen(slash + 1) >= sizeof(q->queue))
			problem = "the URL names no account and queue";
		else
		{
			/* path-style: /{account}/{queue} */
			memcpy(q->account, path + 1, slash - path - 1);
			q->account[slash - path - 1] = '\0';
			strcpy(q->queue, slash + 1);
		}
		if (problem == NULL && curl_url_get(h, CURLUPART_QUERY, &query, 0) == CURLUE_OK &&
			strncmp(query, "queueMessageTimeToLiveInSeconds=", 32) == 0)
			q->ttl_s = strtol(query + 32, NULL, 10);	/* the SQL check took -1 or 1-2147483647 */
		if (problem == NULL)
			snprintf(q->path, sizeof(q->path), "%s/messages", path);
	}
	curl_free(host);
	curl_free(path);
	curl_free(query);
	curl_url_cleanup(h);
	return problem;
}

/*
 * The URL a Put Message to q goes to (palloc'd): the endpoint's scheme,
 * host and port, its path and /messages, messagettl when set, and the SAS
 * token (the request's secret, never logged: the delivery worker logs and
 * records the stored endpoint instead).
 */
char *
eg_storage_put_url(const char *endpoint, const EgStorageQueue *q, const char *sas)
{
	const char *query = strchr(endpoint, '?');
	const char *path_start = strstr(endpoint, "://");
	const char *path = path_start ? strchr(path_start + 3, '/') : NULL;
	StringInfoData url;
	int			host_len = path ? (int) (path - endpoint) : query ? (int) (query - endpoint) : (int) strlen(endpoint);

	initStringInfo(&url);
	appendBinaryStringInfo(&url, endpoint, host_len);
	appendStringInfoString(&url, q->path);
	if (q->ttl_s != 0)
		appendStringInfo(&url, "?messagettl=%ld", q->ttl_s);
	if (sas != NULL)
		appendStringInfo(&url, "%c%s", q->ttl_s != 0 ? '&' : '?', sas[0] == '?' ? sas + 1 : sas);
	return url.data;
}

/* RFC 1123 date of now (x-ms-date), into buf: English names whatever LC_TIME says. */
static void
http_date(char *buf, size_t size)
{
	static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	"Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	time_t		now = time(NULL);
	struct tm	tm;

	gmtime_r(&now, &tm);
	snprintf(buf, size, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
			 months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/*
 * The SharedKey signature of a Put Message of body_len bytes: base64 of
 * HMAC-SHA256, keyed with the decoded account key, over Azure Storage's
 * string to sign (verb, the standard headers of which only Content-Length
 * and Content-Type are set, the x-ms-* headers, the canonicalized
 * resource: /account/path and the query's parameters).  NULL when the key
 * is not base64 or HMAC fails.
 */
static char *
shared_key_signature(const EgStorageQueue *q, const char *key_b64, size_t body_len, const char *date)
{
	int			key_len = pg_b64_dec_len(strlen(key_b64));
	uint8	   *key = palloc(key_len + 1);
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	StringInfoData sts;
	pg_hmac_ctx *ctx;
	char	   *sig = NULL;
	int			sig_len;

	key_len = eg_b64_decode(key_b64, strlen(key_b64), key, key_len);
	if (key_len <= 0)
		return NULL;
	initStringInfo(&sts);
	appendStringInfo(&sts, "POST\n\n\n%zu\n\napplication/xml\n\n\n\n\n\n\n", body_len);
	appendStringInfo(&sts, "x-ms-date:%s\nx-ms-version:%s\n", date, EG_STORAGE_VERSION);
	appendStringInfo(&sts, "/%s%s", q->account, q->path);
	if (q->ttl_s != 0)
		appendStringInfo(&sts, "\nmessagettl:%ld", q->ttl_s);
	ctx = pg_hmac_create(PG_SHA256);
	if (ctx != NULL &&
		pg_hmac_init(ctx, key, key_len) == 0 &&
		pg_hmac_update(ctx, (uint8 *) sts.data, sts.len) == 0 &&
		pg_hmac_final(ctx, mac, sizeof(mac)) == 0)
	{
		sig_len = pg_b64_enc_len(sizeof(mac));
		sig = palloc(sig_len + 1);
		sig_len = eg_b64_encode(mac, sizeof(mac), sig, sig_len);
		if (sig_len < 0)
			sig = NULL;
		else
			sig[sig_len] = '\0';
	}
	pg_hmac_free(ctx);
	explicit_bzero(key, key_len);
	pfree(key);
	pfree(sts.data);
	return sig;
}

/*
 * Fills req with the Put Message of one event: the body (malloc'd, as
 * every request's), Content-Type, x-ms-date, x-ms-version and, with an
 * account key, Authorization: SharedKey.  EG_OUTCOME_NONE, or why it may
 * not be sent (text with no UTF-8 form: EG_OUTCOME_INVALID_ENCODING; an
 * account key that does not sign: EG_OUTCOME_INVALID_HEADER).
 */
EgOutcomeCode
eg_storage_request_build(EgRequest *req, const EgStorageQueue *q, const char *account_key,
						 const EgEventPart *event, StringInfo scratch)
{
	const char *json;
	int			json_len;
	int			b64_len;
	char		date[64];
	char	   *sig = NULL;
	int			n = 0;

	json = eg_to_utf8(event->json, event->len, &json_len);
	if (json == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	resetStringInfo(scratch);
	appendStringInfoString(scratch, "<QueueMessage><MessageText>");
	b64_len = pg_b64_enc_len(json_len);
	enlargeStringInfo(scratch, b64_len + 64);
	b64_len = eg_b64_encode((const uint8 *) json, json_len, scratch->data + scratch->len, b64_len);
	if (json != event->json)
		pfree((char *) json);
	if (b64_len < 0)
		return EG_OUTCOME_INVALID_ENCODING;
	scratch->len += b64_len;
	scratch->data[scratch->len] = '\0';
	appendStringInfoString(scratch, "</MessageText></QueueMessage>");
	req->body = malloc(scratch->len + 1);
	if (req->body == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("eventgrid: out of memory for a %d-byte request body", scratch->len)));
	memcpy(req->body, scratch->data, scratch->len + 1);
	req->body_len = scratch->len;
	req->azure_storage = true;	/* its refused credentials are a 403 AuthenticationFailed */

	http_date(date, sizeof(date));
	if (account_key != NULL && (sig = shared_key_signature(q, account_key, req->body_len, date)) == NULL)
	{
		free(req->body);
		req->body = NULL;
		return EG_OUTCOME_INVALID_HEADER;
	}
	resetStringInfo(scratch);
#define LINE(...) do { appendStringInfo(scratch, __VA_ARGS__); appendStringInfoChar(scratch, '\0'); n++; } while (0)
	LINE("Content-Type: application/xml");
	LINE("x-ms-date: %s", date);
	LINE("x-ms-version: %s", EG_STORAGE_VERSION);
	if (sig != NULL)
		LINE("Authorization: SharedKey %s:%s", q->account, sig);
#undef LINE
	eg_http_set_headers(req, scratch->data, scratch->len, n);
	if (sig != NULL)
		explicit_bzero(scratch->data, scratch->len);
	return EG_OUTCOME_NONE;
}
