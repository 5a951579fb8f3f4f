/*
 * validation.c - endpoint validation (Event Grid's handshake), opt-in per
 * event subscription (endpoint_validation => 'handshake'), sent by the
 * upkeep worker.
 *
 * Event Grid and custom schemas: a POST with aeg-event-type:
 * SubscriptionValidation and one Microsoft.EventGrid.SubscriptionValidationEvent
 * whose data holds a random validationCode; an HTTP 200 whose JSON body
 * has validationResponse equal to it validates, a 200 without it waits for
 * eventgrid.validate_event_subscription() (10 minutes).  CloudEvents: the
 * CloudEvents webhook abuse protection (http-webhook.md section 4), an
 * OPTIONS request with WebHook-Request-Origin (eventgrid.webhook_request_origin)
 * and, for a rate-limited subscription, WebHook-Request-Rate; a 2xx answer
 * whose WebHook-Allowed-Origin is * or that origin validates, and its
 * WebHook-Allowed-Rate becomes the subscription's rate limit.  Each try
 * waits 30 s at most; a failed one is tried again 5 s later, three tries
 * in all (eventgrid._record_validation() decides).  Until validated,
 * nothing is delivered to the subscription: the claims leave it out
 * (eventgrid._held_subscriptions()).  The requests are sent with libcurl
 * (its multi interface, all at once) outside any transaction; the answers
 * are kept in bounded, printable form only.
 */
#include "validation.h"
#include "http.h"
#include "worker.h"

#include <curl/curl.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_VALIDATION_TIMEOUT_MS 30000
#define EG_VALIDATIONS_PER_ROUND 16
#define EG_VALIDATION_BODY_BYTES 1024

typedef struct Transfer
{
	EgValidation *v;
	CURL	   *easy;
	struct curl_slist *headers;
	char		errbuf[CURL_ERROR_SIZE];
	char		body[EG_VALIDATION_BODY_BYTES + 1];
	int			body_len;
	char		origin[257];
	char		rate[65];
} Transfer;

/* The first bytes of the answer's body, printable ASCII (others as '?'). */
static size_t
keep_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Transfer   *t = userdata;
	size_t		n = size * nmemb;

	for (size_t i = 0; i < n && t->body_len < EG_VALIDATION_BODY_BYTES; i++)
	{
		unsigned char c = (unsigned char) ptr[i];

		t->body[t->body_len++] = (c >= 0x20 && c < 0x7f) ? (char) c : '?';
	}
	return n;
}

/* value of header line "Name: value" into out (at most cap - 1 printable bytes), if it is name */
static void
header_value(const char *line, size_t len, const char *name, char *out, size_t cap)
{
	size_t		nl = strlen(name);
	size_t		k = 0;

	if (len <= nl || pg_strncasecmp(line, name, nl) != 0 || line[nl] != ':')
		return;
	line += nl + 1;
	len -= nl + 1;
	while (len > 0 && (*line == ' ' || *line == '\t'))
		line++, len--;
	while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == '\n' || line[len - 1] == ' '))
		len--;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) line[i] < 0x20 || (unsigned char) line[i] >= 0x7f)
			return;				/* not a value to keep */
	k = Min(len, cap - 1);
	memcpy(out, line, k);
	out[k] = '\0';
}

static size_t
keep_headers(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Transfer   *t = userdata;
	size_t		n = size * nmemb;

	header_value(ptr, n, "WebHook-Allowed-Origin", t->origin, sizeof(t->origin));
	header_value(ptr, n, "WebHook-Allowed-Rate", t->rate, sizeof(t->rate));
	return n;
}

/* adds "Name: value" to t's headers */
static bool
add_header(Transfer *t, const char *line)
{
	struct curl_slist *l = curl_slist_append(t->headers, line);

	if (l == NULL)
		return false;
	t->headers = l;
	return true;
}

/* Sets up one transfer; false when libcurl refused (the validation's error says why). */
static bool
setup(Transfer *t, const char *origin)
{
	EgValidation *v = t->v;
	CURLcode	rc;
	char		line[512];
	bool		ok = true;

	t->easy = curl_easy_init();
	if (t->easy == NULL)
		return false;
	rc = eg_http_safe_options(t->easy, eg_ssl_ca_file);
#define SET(opt, val) do { if (rc == CURLE_OK) rc = curl_easy_setopt(t->easy, (opt), (val)); } while (0)
	SET(CURLOPT_URL, v->endpoint);
	SET(CURLOPT_TIMEOUT_MS, (long) EG_VALIDATION_TIMEOUT_MS);
	SET(CURLOPT_ERRORBUFFER, t->errbuf);
	SET(CURLOPT_WRITEFUNCTION, keep_body);
	SET(CURLOPT_WRITEDATA, t);
	SET(CURLOPT_HEADERFUNCTION, keep_headers);
	SET(CURLOPT_HEADERDATA, t);
	if (v->cloudevents)
	{
		SET(CURLOPT_CUSTOMREQUEST, "OPTIONS");
		snprintf(line, sizeof(line), "WebHook-Request-Origin: %s", origin);
		ok = ok && add_header(t, line);
		if (v->rate > 0)
		{
			snprintf(line, sizeof(line), "WebHook-Request-Rate: %lld", (long long) v->rate * 60);
			ok = ok && add_header(t, line);
		}
	}
	else
	{
		SET(CURLOPT_POST, 1L);
		SET(CURLOPT_POSTFIELDS, v->body);
		SET(CURLOPT_POSTFIELDSIZE, (long) strlen(v->body));
		ok = ok && add_header(t, "Content-Type: application/json");
		ok = ok && add_header(t, "aeg-event-type: SubscriptionValidation");
		snprintf(line, sizeof(line), "aeg-subscription-name: %s", v->name);
		ok = ok && add_header(t, line);
		ok = ok && add_header(t, "aeg-delivery-count: 0");
		ok = ok && add_header(t, "aeg-metadata-version: 1");
		ok = ok && add_header(t, "aeg-data-version: 2");
	}
	/* the subscription's static custom headers (checked when they were set) */
	for (char *h = v->headers; ok && h != NULL && *h != '\0';)
	{
		char	   *end = strchr(h, '\n');
		char	   *one = end ? pnstrdup(h, end - h) : pstrdup(h);

		ok = add_header(t, one);
		pfree(one);
		h = end ? end + 1 : NULL;
	}
	SET(CURLOPT_HTTPHEADER, t->headers);
#undef SET
	return rc == CURLE_OK && ok;
}

void
eg_validation_send(EgValidation *v, int n, const char *origin)
{
	static bool curl_ready = false;
	CURLM	   *multi;
	Transfer   *t = palloc0(n * sizeof(Transfer));
	int			running = 0;
	CURLMsg    *msg;
	int			left;

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
			elog(ERROR, "eventgrid: curl_global_init failed");
		curl_ready = true;
	}
	multi = curl_multi_init();
	if (multi == NULL)
		elog(ERROR, "eventgrid: curl_multi_init failed");
	for (int i = 0; i < n; i++)
	{
		t[i].v = &v[i];
		if (!setup(&t[i], origin) || curl_multi_add_handle(multi, t[i].easy) != CURLM_OK)
		{
			v[i].error = pstrdup(t[i].errbuf[0] ? t[i].errbuf : "the request could not be set up");
			if (t[i].easy)
				curl_easy_cleanup(t[i].easy);
			curl_slist_free_all(t[i].headers);
			t[i].easy = NULL;
		}
	}
	do
	{
		if (curl_multi_perform(multi, &running) != CURLM_OK)
			break;
		if (running > 0)
			(void) curl_multi_poll(multi, NULL, 0, 200, NULL);
		CHECK_FOR_INTERRUPTS();
		if (!PostmasterIsAlive())
			proc_exit(1);
	} while (running > 0);
	while ((msg = curl_multi_info_read(multi, &left)) != NULL)
	{
		if (msg->msg != CURLMSG_DONE)
			continue;
		for (int i = 0; i < n; i++)
		{
			long		status = 0;

			if (t[i].easy != msg->easy_handle)
				continue;
			if (msg->data.result != CURLE_OK)
				v[i].error = pstrdup(t[i].errbuf[0] ? t[i].errbuf : curl_easy_strerror(msg->data.result));
			else
			{
				curl_easy_getinfo(t[i].easy, CURLINFO_RESPONSE_CODE, &status);
				v[i].http_status = (int) status;
			}
		}
	}
	for (int i = 0; i < n; i++)
	{
		if (t[i].easy == NULL)
			continue;
		if (v[i].error == NULL && v[i].http_status == 0)
			v[i].error = pstrdup("no answer");
		t[i].body[t[i].body_len] = '\0';
		v[i].answer_body = pstrdup(t[i].body);
		v[i].allowed_origin = t[i].origin[0] ? pstrdup(t[i].origin) : NULL;
		v[i].allowed_rate = t[i].rate[0] ? pstrdup(t[i].rate) : NULL;
		curl_multi_remove_handle(multi, t[i].easy);
		curl_easy_cleanup(t[i].easy);
		curl_slist_free_all(t[i].headers);
	}
	curl_multi_cleanup(multi);
	pfree(t);
}

bool
eg_validate_endpoints(void)
{
	static MemoryContext cxt = NULL;
	EgValidation *v;
	int64		pending = 0;
	int			n;
	const char *origin = eg_webhook_request_origin && eg_webhook_request_origin[0]
		? eg_webhook_request_origin : "eventgrid";

	if (cxt == NULL)
		cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid endpoint validations", ALLOCSET_SMALL_SIZES);
	MemoryContextReset(cxt);
	if (!eg_begin_work("eventgrid: looking up endpoint validations"))
		return false;
	n = eg_store_due_validations(eg_now(), EG_VALIDATIONS_PER_ROUND, cxt, &v, &pending);
	eg_end_work();
	if (n == 0)
		return pending > 0;

	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		pgstat_report_activity(STATE_RUNNING, "eventgrid: validating endpoints");
		eg_validation_send(v, n, origin);
		MemoryContextSwitchTo(old);
	}

	if (!eg_begin_work("eventgrid: recording endpoint validations"))
		return true;
	for (int i = 0; i < n; i++)
	{
		char	   *state = eg_store_record_validation(&v[i], origin);

		if (state != NULL && strcmp(state, "Creating") != 0)
			ereport(LOG,
					(errmsg("eventgrid: endpoint validation of event subscription \"%s\" of topic \"%s\": %s",
							v[i].name, v[i].topic, state),
					 strcmp(state, "AwaitingManualAction") == 0
					 ? errhint("Call eventgrid.validate_event_subscription() with the validationCode the endpoint received within 10 minutes.")
					 : strcmp(state, "Failed") == 0
					 ? errhint("eventgrid.event_subscription_validation says why; update_event_subscription(..., endpoint_validation => 'handshake') tries again.")
					 : 0));
	}
	eg_end_work();
	eg_wake_worker();
	return true;
}
