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
#include "delivery/validation.h"
#include "http/http.h"
#include "delivery/auth.h"
#include "store/worker.h"

#include <curl/curl.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
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
	char		body[EG_VALIDATION_BODY_BYTES];
	int			body_len;
} Transfer;

/* The first EG_VALIDATION_BODY_BYTES of the answer's body. */
static size_t
keep_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Transfer   *t = userdata;
	size_t		n = size * nmemb;
	size_t		take = Min(n, (size_t) (EG_VALIDATION_BODY_BYTES - t->body_len));

	memcpy(t->body + t->body_len, ptr, take);
	t->body_len += (int) take;
	return n;
}

/*
 * The value of the answer's header name (its last one, as libcurl parsed
 * it), at most cap - 1 bytes; NULL when there is none, it is empty or it
 * holds a byte outside printable ASCII.
 */
static char *
answer_header(CURL *easy, const char *name, size_t cap)
{
	struct curl_header *h;
	size_t		len;

	if (curl_easy_header(easy, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK)
		return NULL;
	if (h->amount > 1 && curl_easy_header(easy, name, h->amount - 1, CURLH_HEADER, -1, &h) != CURLHE_OK)
		return NULL;
	len = strlen(h->value);
	if (len == 0)
		return NULL;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) h->value[i] < 0x20 || (unsigned char) h->value[i] >= 0x7f)
			return NULL;		/* not a value to keep */
	return pnstrdup(h->value, Min(len, cap - 1));
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
	if (ok && v->auth != NULL)
	{
		/* the bearer token, as on every request of the subscription (SPEC 12) */
		EgCredentials c;
		EgToken    *token = palloc(sizeof(EgToken));

		eg_auth_credentials(v->auth, &c);
		if (eg_token_get_now(&c, eg_ssl_ca_file, token))
		{
			char	   *auth = psprintf("Authorization: Bearer %s", token->text);

			ok = add_header(t, auth);
			explicit_bzero(auth, strlen(auth));
			explicit_bzero(token->text, token->len);
		}
		else
		{
			snprintf(t->errbuf, sizeof(t->errbuf), "no bearer token: %s", token->error);
			ok = false;
		}
		pfree(token);
	}
	SET(CURLOPT_HTTPHEADER, t->headers);
#undef SET
	if (rc == CURLE_OK && v->client_cert != NULL && v->client_key != NULL)
	{
		EgClientCert c = {v->client_cert, strlen(v->client_cert), v->client_key, strlen(v->client_key)};

		rc = eg_http_client_cert_options(t->easy, &c);
	}
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
			const char *e = t[i].errbuf[0] ? t[i].errbuf : "the request could not be set up";

			v[i].error = eg_printable_copy(e, strlen(e));
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
		if (eg_db_leaving())
			break;				/* the handshakes are sent again when the worker is back */
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
			{
				const char *e = t[i].errbuf[0] ? t[i].errbuf : curl_easy_strerror(msg->data.result);

				v[i].error = eg_printable_copy(e, strlen(e));
			}
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
		v[i].answer_body = eg_printable_copy(t[i].body, t[i].body_len);
		v[i].allowed_origin = answer_header(t[i].easy, "WebHook-Allowed-Origin", 257);
		v[i].allowed_rate = answer_header(t[i].easy, "WebHook-Allowed-Rate", 65);
		curl_multi_remove_handle(multi, t[i].easy);
		curl_easy_cleanup(t[i].easy);
		curl_slist_free_all(t[i].headers);
	}
	curl_multi_cleanup(multi);
	pfree(t);
}

/*
 * Records one validation's answer in a subtransaction of its own and
 * returns the new provisioning state (in cxt), or NULL when the validation
 * changed meanwhile.  An answer that cannot be recorded (whatever the
 * receiver sent made the record fail) is one failed try of this
 * subscription, recorded without the answer; the others are recorded
 * all the same.
 */
static char *
record_one(EgValidation *v, const char *origin, MemoryContext cxt)
{
	MemoryContext unit = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	char	   *state = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(unit);
	PG_TRY();
	{
		state = eg_store_record_validation(v, origin);
		state = state ? MemoryContextStrdup(cxt, state) : NULL;
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(unit);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(unit);
		CurrentResourceOwner = owner;
		v->answer_body = NULL;
		v->allowed_origin = NULL;
		v->allowed_rate = NULL;
		v->error = psprintf("the answer could not be read: %s", edata->message);
		FreeErrorData(edata);
		state = eg_store_record_validation(v, origin);
		state = state ? MemoryContextStrdup(cxt, state) : NULL;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(unit);
	CurrentResourceOwner = owner;
	return state;
}

bool
eg_validate_endpoints(void)
{
	static MemoryContext cxt = NULL;
	EgValidation *v;
	int64		pending = 0;
	int			n;
	char	  **states;
	const char *origin = eg_webhook_request_origin && eg_webhook_request_origin[0]
		? eg_webhook_request_origin : "eventgrid";

	if (cxt == NULL)
		cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid endpoint validations", ALLOCSET_SMALL_SIZES);
	MemoryContextReset(cxt);
	if (!eg_begin_work("eventgrid: looking up endpoint validations"))
		return false;
	eg_pause_point("validations-due");	/* tests: the unit's first snapshot taken, the look's not yet */
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
	eg_pause_point("validations-sent");

	/* cut short to leave: nothing is recorded, the same handshakes go again next time */
	if (eg_db_leaving())
		return true;
	states = MemoryContextAllocZero(cxt, n * sizeof(char *));
	if (!eg_begin_work("eventgrid: recording endpoint validations"))
		return true;
	for (int i = 0; i < n; i++)
		states[i] = record_one(&v[i], origin, cxt);
	eg_end_work();
	/* logged once committed: a record that failed later must not have said Succeeded */
	for (int i = 0; i < n; i++)
		if (states[i] != NULL && strcmp(states[i], "Creating") != 0)
			ereport(LOG,
					(errmsg("eventgrid: endpoint validation of event subscription \"%s\" of topic \"%s\": %s",
							v[i].name, v[i].topic, states[i]),
					 strcmp(states[i], "AwaitingManualAction") == 0
					 ? errhint("Call eventgrid.validate_event_subscription() with the validationCode the endpoint received within 10 minutes.")
					 : strcmp(states[i], "Failed") == 0
					 ? errhint("eventgrid.event_subscription_validation says why; update_event_subscription(..., endpoint_validation => 'handshake') tries again.")
					 : 0));
	/* a validated endpoint's held events: the delivery workers' next claims sweep */
	for (int i = 0; i < n; i++)
		if (states[i] != NULL && strcmp(states[i], "Succeeded") == 0)
		{
			eg_subscriptions_changed();
			break;
		}
	eg_wake_worker();
	return true;
}
