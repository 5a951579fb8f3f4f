/*
 * endpoint.c - the delivery worker's view of its endpoints: a fair queue of
 * requests per endpoint host, and each endpoint URL's health (SPEC section
 * 6, delayed delivery).
 *
 * Isolation.  Requests wait in one queue per host, that is per (scheme,
 * host, port) of their URL.  Hosts take turns (round robin) for the free
 * connections, and no host has more than eventgrid.max_requests_per_endpoint
 * requests in flight, so an endpoint that hangs holds at most that many
 * connections and the others always get their turn.  A host with at least
 * eventgrid.max_concurrent_requests requests waiting is "backed up": the
 * worker claims nothing more for the event subscriptions whose requests
 * wait there (eg_targets_skip_list) until it drains, so a slow endpoint's
 * backlog waits in the database, not in the worker's memory, and does not
 * use up the worker's eventgrid.max_bytes_in_flight either.
 *
 * Health.  Each endpoint URL (event subscriptions with the same URL share
 * it) counts its consecutive failed delivery attempts.  At
 * eventgrid.probation_failures of them the endpoint is put on probation for
 * eg_probation_ms() of the last failure's outcome: requests to it are not
 * sent but held (the worker records them as attempts with outcome
 * Probation, due again on the retry schedule).  When the probation time is
 * over, the next request to it is sent as the probe and the others are held
 * while it is in flight; the probe's success (or any success) ends
 * probation, its failure starts the next, twice as long, at most 4 hours.
 * Outcomes that concern the event rather than the endpoint (BadRequest,
 * PayloadTooLarge) neither count nor reset.  Entering and leaving probation
 * are logged once each (naming the host and an event subscription, never
 * the URL's path or query); the state is written to eventgrid.endpoint_states
 * with the outcomes (eg_targets_dirty), and read back when a worker starts.
 */
#include "eventgrid.h"

#include "common/hashfn.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include <curl/curl.h>

#define EG_TARGET_IDLE_MS (10 * 60 * 1000)	/* forget a healthy, idle URL after this */

typedef struct EgHost
{
	const char *key;			/* hash key: "scheme://host:port" */
	int			in_flight;		/* requests started (or about to be) */
	int			queued;
	int64		queued_bytes;
	EgRequest  *head;			/* requests waiting, in order */
	EgRequest  *tail;
	int			targets;		/* URLs of this host known */
	bool		in_ring;
	bool		skipped;		/* a claim left its subscriptions out */
	struct EgHost *ring_next;
	struct EgHost *ring_prev;
} EgHost;

struct EgTarget
{
	const char *url;			/* hash key */
	EgHost	   *host;
	int			waiting;		/* requests queued or in flight */
	TimestampTz last_used;
	/* health */
	int			consecutive_failures;
	const char *last_failure;	/* static outcome name, or NULL */
	const char *cause;			/* outcome that started the probation */
	TimestampTz probation_started;	/* 0: healthy */
	TimestampTz probation_until;
	int			probations;		/* in a row since the last success */
	bool		probing;		/* the probe is in flight */
	bool		dirty;			/* not yet written to eventgrid.endpoint_states */
};

static HTAB *targets = NULL;
static HTAB *hosts = NULL;
static EgHost *ring = NULL;		/* hosts with requests waiting */
static int	queued_total = 0;
static TimestampTz last_sweep = 0;
static bool unblocked = false;	/* a skipped host drained below its mark */

static uint32
str_hash(const void *key, Size keysize)
{
	const char *s = *(const char *const *) key;

	return hash_bytes((const unsigned char *) s, (int) strlen(s));
}

static int
str_match(const void *a, const void *b, Size keysize)
{
	return strcmp(*(const char *const *) a, *(const char *const *) b);
}

static HTAB *
string_table(const char *name, Size entrysize)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(char *);
	ctl.entrysize = entrysize;
	ctl.hash = str_hash;
	ctl.match = str_match;
	ctl.hcxt = TopMemoryContext;
	return hash_create(name, 64, &ctl, HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/* "scheme://host:port" of a URL, by libcurl's parser (the URL itself if it does not parse). */
static char *
host_key(const char *url)
{
	CURLU	   *h = curl_url();
	char	   *scheme = NULL,
			   *host = NULL,
			   *port = NULL;
	char	   *key;

	if (h != NULL && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
		key = psprintf("%s://%s:%s", scheme, host, port);
	else
		key = pstrdup(url);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_url_cleanup(h);
	return key;
}

static void
ring_add(EgHost *h)
{
	if (h->in_ring)
		return;
	h->in_ring = true;
	if (ring == NULL)
		h->ring_next = h->ring_prev = h;
	else
	{
		h->ring_next = ring;
		h->ring_prev = ring->ring_prev;
		ring->ring_prev->ring_next = h;
		ring->ring_prev = h;
	}
	if (ring == NULL)
		ring = h;
}

static void
ring_remove(EgHost *h)
{
	if (!h->in_ring)
		return;
	h->in_ring = false;
	if (h->ring_next == h)
		ring = NULL;
	else
	{
		h->ring_prev->ring_next = h->ring_next;
		h->ring_next->ring_prev = h->ring_prev;
		if (ring == h)
			ring = h->ring_next;
	}
	h->ring_next = h->ring_prev = NULL;
}

static bool
backed_up(const EgHost *h)
{
	return h->queued >= eg_max_concurrent_requests;
}

/* Forgets healthy URLs with nothing waiting that were not used for a while. */
static void
sweep(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	EgTarget   *t;

	if (now - last_sweep < (TimestampTz) 60 * 1000 * 1000)
		return;
	last_sweep = now;
	hash_seq_init(&seq, targets);
	while ((t = hash_seq_search(&seq)) != NULL)
	{
		EgHost	   *h = t->host;
		char	   *url = (char *) t->url;
		bool		found;

		if (t->waiting > 0 || t->dirty || t->probation_started != 0 || t->consecutive_failures > 0 ||
			now - t->last_used < (TimestampTz) EG_TARGET_IDLE_MS * 1000)
			continue;
		hash_search(targets, &url, HASH_REMOVE, &found);
		pfree(url);
		if (--h->targets == 0 && h->queued == 0 && h->in_flight == 0)
		{
			const char *key = h->key;

			ring_remove(h);
			hash_search(hosts, &key, HASH_REMOVE, &found);
			pfree((char *) key);
		}
	}
}

/*
 * The endpoint of URL url, created (healthy, no failures) when first asked
 * for; lives in TopMemoryContext while requests to it wait or it is not
 * healthy.
 */
EgTarget *
eg_target(const char *url)
{
	EgTarget   *t;
	bool		found;

	if (targets == NULL)
	{
		targets = string_table("eventgrid endpoints", sizeof(EgTarget));
		hosts = string_table("eventgrid endpoint hosts", sizeof(EgHost));
	}
	t = hash_search(targets, &url, HASH_ENTER, &found);
	if (!found)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		char	   *key = host_key(url);
		EgHost	   *h;

		memset(t, 0, sizeof(EgTarget));
		t->url = pstrdup(url);
		h = hash_search(hosts, &key, HASH_ENTER, &found);
		if (!found)
		{
			memset(h, 0, sizeof(EgHost));
			h->key = key;
		}
		else
			pfree(key);
		h->targets++;
		t->host = h;
		t->last_used = GetCurrentTimestamp();	/* and when each request to it finishes */
		MemoryContextSwitchTo(old);
	}
	return t;
}

/* The URL of an endpoint (valid as long as requests to it wait). */
const char *
eg_target_url(const EgTarget *t)
{
	return t->url;
}

/* When the endpoint's probation time ends (0: not on probation; in the past: its probe is due or in flight). */
TimestampTz
eg_target_probation_until(const EgTarget *t)
{
	return t->probation_started != 0 ? t->probation_until : 0;
}

/* Queues req (req->target set, req->bytes its event bytes) behind its host's other requests. */
void
eg_target_queue(EgRequest *req)
{
	EgHost	   *h = req->target->host;

	req->next = NULL;
	req->probe = false;
	if (h->tail)
		h->tail->next = req;
	else
		h->head = req;
	h->tail = req;
	h->queued++;
	h->queued_bytes += req->bytes;
	req->target->waiting++;
	queued_total++;
	ring_add(h);
}

/* Does the endpoint of t hold its requests back now (on probation, or its probe in flight)? */
static bool
holds(const EgTarget *t, TimestampTz now)
{
	return t->probation_started != 0 && (t->probing || now < t->probation_until);
}

/*
 * The next request to take from the queues, hosts in turn: one its
 * endpoint holds back (*hold set: the caller records its deliveries as held
 * and frees it), or, while may_send, one that may be sent now (its host
 * below eventgrid.max_requests_per_endpoint; counted in flight from here,
 * and the probe of an endpoint whose probation time is over).  NULL when
 * there is none.
 */
EgRequest *
eg_target_next(TimestampTz now, bool may_send, bool *hold)
{
	EgHost	   *start = ring;
	EgHost	   *h = ring;

	while (h != NULL)
	{
		EgHost	   *next = h->ring_next;
		EgRequest  *req = h->head;

		if (req == NULL)
		{
			ring_remove(h);
			if (ring == NULL)
				return NULL;
			if (h == start)
				start = next;
			h = next;
			continue;
		}
		*hold = holds(req->target, now);
		if (*hold || (may_send && h->in_flight < eg_max_requests_per_endpoint))
		{
			h->head = req->next;
			if (h->head == NULL)
				h->tail = NULL;
			req->next = NULL;
			h->queued--;
			h->queued_bytes -= req->bytes;
			queued_total--;
			if (h->skipped && !backed_up(h))
			{
				h->skipped = false;
				unblocked = true;
			}
			if (*hold)
				req->target->waiting--;
			else
			{
				EgTarget   *t = req->target;

				h->in_flight++;
				if (t->probation_started != 0)
				{
					/* probation is over: this request is the probe */
					req->probe = true;
					t->probing = true;
					t->dirty = true;
				}
			}
			ring = next;		/* the next host's turn */
			if (h->head == NULL)
				ring_remove(h);
			return req;
		}
		h = next;
		if (h == start)
			break;
	}
	return NULL;
}

/*
 * Puts back a request eg_target_next() gave for sending, which could not be
 * started (its in-flight record failed): at the head of its host's queue.
 * Requests put back in the reverse of the order they were taken keep their
 * order.
 */
void
eg_target_unsend(EgRequest *req)
{
	EgHost	   *h = req->target->host;

	h->in_flight--;
	if (req->probe)
	{
		req->probe = false;
		req->target->probing = false;
	}
	req->next = h->head;
	h->head = req;
	if (h->tail == NULL)
		h->tail = req;
	h->queued++;
	h->queued_bytes += req->bytes;
	queued_total++;
	ring_add(h);
}

/*
 * Log lines name an endpoint by its host ("scheme://host:port", never the
 * path or query, which may hold a secret) and the event subscription whose
 * request changed its state; eventgrid.endpoint_health has the rest.
 */
static void
start_probation(EgTarget *t, const EgRequest *req, const char *outcome, TimestampTz now)
{
	int64		ms;

	t->probations++;
	ms = eg_probation_ms(outcome, t->probations);
	if (t->probation_started == 0)
	{
		t->probation_started = now;
		ereport(LOG,
				(errmsg("eventgrid: the endpoint of event subscription \"%s\" (%s) is on probation for %lld s after %d consecutive failed delivery attempts (last outcome %s)",
						req->subscription_name, t->host->key, (long long) (ms / 1000),
						t->consecutive_failures, outcome),
				 errdetail("Nothing is sent to it until then; deliveries that come due meanwhile are recorded with outcome Probation."),
				 errhint("See eventgrid.endpoint_health.")));
	}
	else
		ereport(DEBUG1,
				(errmsg("eventgrid: the endpoint of event subscription \"%s\" (%s) failed its probe (%s); probation %d lasts %lld s",
						req->subscription_name, t->host->key, outcome, t->probations, (long long) (ms / 1000))));
	t->cause = outcome;
	t->probation_until = now + ms * 1000;
	t->dirty = true;
}

/*
 * Accounts for a request that was sent and has finished with this
 * transport result and HTTP status: the host has a free slot, and the
 * endpoint's health follows the outcome.  Returns whether the outcome ended
 * a probation.
 */
bool
eg_target_finished(EgRequest *req, TimestampTz now)
{
	EgTarget   *t = req->target;
	const char *outcome = eg_outcome_name(req->transport, req->http_status);
	bool		healthy = eg_probation_ms(outcome, 1) < 0;
	bool		ended = false;

	t->host->in_flight--;
	t->waiting--;
	t->last_used = GetCurrentTimestamp();
	if (req->probe)
		t->probing = false;

	if (strcmp(outcome, "Delivered") == 0 || (req->probe && healthy))
	{
		if (t->probation_started != 0)
		{
			ereport(LOG,
					(errmsg("eventgrid: the endpoint of event subscription \"%s\" (%s) is healthy again: a delivery attempt succeeded after %d probations",
							req->subscription_name, t->host->key, t->probations),
					 errdetail("It was on probation since %s, first for outcome %s.",
							   timestamptz_to_str(t->probation_started), t->cause)));
			ended = true;
		}
		if (t->consecutive_failures > 0 || t->probation_started != 0)
			t->dirty = true;
		t->consecutive_failures = 0;
		t->probations = 0;
		t->probation_started = 0;
		t->probation_until = 0;
		t->cause = NULL;
		return ended;
	}
	if (healthy)
		return false;			/* BadRequest, PayloadTooLarge: the event's problem */
	t->consecutive_failures++;
	t->last_failure = outcome;
	t->dirty = true;
	if (req->probe)
		start_probation(t, req, outcome, now);
	else if (t->probation_started == 0 && t->consecutive_failures >= eg_probation_failures)
		start_probation(t, req, outcome, now);
	return false;
}

/*
 * What waits, seen from the claim: requests waiting on hosts that are not
 * backed up (*ready: they may start soon), and the event bytes of the
 * requests waiting on backed-up hosts (*backed_up_bytes).
 */
void
eg_targets_waiting(int *ready, int64 *backed_up_bytes)
{
	EgHost	   *h = ring;

	*ready = 0;
	*backed_up_bytes = 0;
	if (h == NULL)
		return;
	do
	{
		if (backed_up(h))
			*backed_up_bytes += h->queued_bytes;
		else
			*ready += h->queued;
		h = h->ring_next;
	} while (h != ring);
}

/* Requests waiting, on all hosts. */
int
eg_targets_queued(void)
{
	return queued_total;
}

static int
cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * The event subscriptions whose requests wait on backed-up hosts, for the
 * next claim to leave out (palloc'd, sorted, distinct; count returned).
 */
int
eg_targets_skip_list(int64 **subs)
{
	int			cap = 0;
	int			n = 0;
	int64	   *out;
	EgHost	   *h = ring;

	*subs = NULL;
	if (h == NULL)
		return 0;
	do
	{
		if (backed_up(h))
			cap += h->queued;
		h = h->ring_next;
	} while (h != ring);
	if (cap == 0)
		return 0;
	out = palloc(cap * sizeof(int64));
	do
	{
		if (backed_up(h))
		{
			h->skipped = true;
			for (EgRequest *r = h->head; r; r = r->next)
				out[n++] = r->subscription_id;
		}
		h = h->ring_next;
	} while (h != ring);
	qsort(out, n, sizeof(int64), cmp_int64);
	cap = n;
	n = 0;
	for (int i = 0; i < cap; i++)
		if (n == 0 || out[n - 1] != out[i])
			out[n++] = out[i];
	*subs = out;
	return n;
}

/* Has a host that a claim left out drained below its mark since the last call (claim again)? */
bool
eg_targets_unblocked(void)
{
	bool		was = unblocked;

	unblocked = false;
	return was;
}

static void
to_health(const EgTarget *t, EgHealth *e)
{
	e->endpoint = t->url;
	e->state = t->probation_started == 0 ? "healthy" : t->probing ? "probing" : "probation";
	e->consecutive_failures = t->consecutive_failures;
	e->last_failure_outcome = t->consecutive_failures > 0 ? t->last_failure : NULL;
	e->probation_cause = t->probation_started ? t->cause : NULL;
	e->probation_started_at = t->probation_started;
	e->probation_until = t->probation_started ? t->probation_until : 0;
	e->probations = t->probations;
}

/*
 * The endpoints whose health changed since they were last written
 * (palloc'd; count returned).  Call eg_targets_written() once they are
 * committed.
 */
int
eg_targets_dirty(EgHealth **out)
{
	HASH_SEQ_STATUS seq;
	EgTarget   *t;
	int			n = 0;
	int			cap = 16;

	*out = NULL;
	if (targets == NULL)
		return 0;
	*out = palloc(cap * sizeof(EgHealth));
	hash_seq_init(&seq, targets);
	while ((t = hash_seq_search(&seq)) != NULL)
	{
		if (!t->dirty)
			continue;
		if (n == cap)
		{
			cap *= 2;
			*out = repalloc(*out, cap * sizeof(EgHealth));
		}
		to_health(t, &(*out)[n++]);
	}
	return n;
}

/* The health of these endpoints (from eg_targets_dirty) is committed. */
void
eg_targets_written(const EgHealth *written, int n)
{
	for (int i = 0; i < n; i++)
	{
		const char *url = written[i].endpoint;
		EgTarget   *t = hash_search(targets, &url, HASH_FIND, NULL);

		if (t)
			t->dirty = false;
	}
	sweep(GetCurrentTimestamp());
}

/* An outcome name read from the database, kept for the life of the worker. */
static const char *
intern(const char *outcome)
{
	return outcome ? MemoryContextStrdup(TopMemoryContext, outcome) : NULL;
}

/*
 * Takes over the health written by an earlier run of the worker.  A probe
 * that was in flight then is lost: the endpoint is on probation, its probe
 * due when the probation time is over.
 */
void
eg_targets_load(const EgHealth *rows, int n)
{
	for (int i = 0; i < n; i++)
	{
		EgTarget   *t = eg_target(rows[i].endpoint);

		t->consecutive_failures = rows[i].consecutive_failures;
		t->last_failure = intern(rows[i].last_failure_outcome);
		t->probations = rows[i].probations;
		t->probation_started = rows[i].probation_started_at;
		t->probation_until = rows[i].probation_until;
		t->cause = intern(rows[i].probation_cause);
		t->probing = false;
		t->dirty = strcmp(rows[i].state, "probing") == 0;
	}
}
