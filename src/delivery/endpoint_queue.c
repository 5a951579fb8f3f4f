/*
 * endpoint_queue.c - the delivery worker's requests waiting per endpoint
 * host (isolation, SPEC section 6: healthy subscriptions are never slowed
 * by an unhealthy one).
 *
 * Requests wait in one queue per host, that is per (scheme, host, port) of
 * their URL (eg_url_host_key).  Hosts take turns (round robin) for the free
 * connections, and no host has more than eventgrid.max_requests_per_endpoint
 * requests in flight (from every delivery worker of every database
 * together), so an endpoint that hangs holds at most that many
 * connections and the others always get their turn.  A host with at least
 * eventgrid.max_concurrent_requests requests waiting is "backed up": the
 * worker claims nothing more for the event subscriptions whose requests
 * wait there (eg_targets_skip_list) until it drains, so a slow endpoint's
 * backlog waits in the database, not in the worker's memory, and does not
 * use up the worker's eventgrid.max_bytes_in_flight either.  Whether a
 * request is sent or held back is the endpoint's health's call
 * (endpoint_health.c).
 */
#include "delivery/endpoint.h"
#include "delivery/auth.h"
#include "http/url.h"

#include "common/hashfn.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_TARGET_IDLE_MS (10 * 60 * 1000)	/* forget a healthy, idle URL after this */

HTAB	   *eg_targets_table = NULL;
static HTAB *hosts = NULL;
static EgHost *ring = NULL;		/* hosts with requests waiting */
static int	queued_total = 0;
static TimestampTz last_sweep = 0;
static bool unblocked = false;	/* a skipped host drained below its mark */

/*
 * Requests in flight to a host, counted for every delivery worker of every
 * database in shared memory (EgShared.hosts), so that
 * eventgrid.max_requests_per_endpoint protects a receiver whichever
 * database or worker the requests come from.  The slot of a host is one of
 * EG_HOST_PROBE its key's hash selects; one whose count is 0 is free.  With
 * all of them taken (thousands of hosts in flight at once) the host is
 * counted by this worker alone.  Each worker gives back its own count when
 * it exits (eg_targets_release_hosts).
 */
#define EG_HOST_PROBE 8

static EgHostSlot *
host_slot_locked(uint64 hash)
{
	EgHostSlot *free_slot = NULL;

	for (int k = 0; k < EG_HOST_PROBE; k++)
	{
		EgHostSlot *hs = &eg_shared->hosts[(hash + k) % EG_HOST_SLOTS];

		if (hs->hash == hash && hs->in_flight > 0)
			return hs;
		if (free_slot == NULL && hs->in_flight == 0)
			free_slot = hs;
	}
	if (free_slot != NULL)
		free_slot->hash = hash;
	return free_slot;
}

/* One more request to host h may start (counted here and in shared memory), or false. */
static bool
host_acquire(EgHost *h)
{
	EgHostSlot *hs;
	bool		ok;

	if (h->in_flight >= eg_max_requests_per_endpoint)
		return false;
	SpinLockAcquire(&eg_shared->mutex);
	hs = host_slot_locked(h->hash);
	ok = hs == NULL || hs->in_flight < eg_max_requests_per_endpoint;
	if (ok && hs != NULL)
	{
		hs->in_flight++;
		h->shared_in_flight++;
	}
	SpinLockRelease(&eg_shared->mutex);
	if (ok)
		h->in_flight++;
	return ok;
}

/*
 * A new HTTPS host gets one request first: until its answer says whether
 * the host speaks HTTP/2 (or EG_PROTOCOL_WAIT_MS passed), no other starts,
 * since each would open a connection of its own before the first is up to
 * multiplex over (bench figure 12: 54 connections to an HTTP/2 host).
 */
#define EG_PROTOCOL_WAIT_MS 500

static bool
learning_protocol(const EgHost *h, TimestampTz now)
{
	return h->tls && h->http_version == 0 && h->in_flight > 0
		&& now - h->first_sent_at < (TimestampTz) EG_PROTOCOL_WAIT_MS * 1000;
}

/* A request to host h is no longer in flight (or was not started after all). */
static void
host_release(EgHost *h)
{
	h->in_flight--;
	if (h->shared_in_flight == 0)
		return;
	h->shared_in_flight--;
	SpinLockAcquire(&eg_shared->mutex);
	for (int k = 0; k < EG_HOST_PROBE; k++)
	{
		EgHostSlot *hs = &eg_shared->hosts[(h->hash + k) % EG_HOST_SLOTS];

		if (hs->hash == h->hash && hs->in_flight > 0)
		{
			hs->in_flight--;
			break;
		}
	}
	SpinLockRelease(&eg_shared->mutex);
}

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
void
eg_targets_sweep(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	EgTarget   *t;

	/* no endpoint looked up yet: a worker whose first deliveries all ended unsent */
	if (eg_targets_table == NULL || now - last_sweep < (TimestampTz) 60 * 1000 * 1000)
		return;
	last_sweep = now;
	hash_seq_init(&seq, eg_targets_table);
	while ((t = hash_seq_search(&seq)) != NULL)
	{
		EgHost	   *h = t->host;
		char	   *url = (char *) t->url;
		bool		found;

		if (t->waiting > 0 || t->dirty || t->probation_started != 0 || t->consecutive_failures > 0 ||
			now - t->last_used < (TimestampTz) EG_TARGET_IDLE_MS * 1000)
			continue;
		hash_search(eg_targets_table, &url, HASH_REMOVE, &found);
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

	if (eg_targets_table == NULL)
	{
		eg_targets_table = string_table("eventgrid endpoints", sizeof(EgTarget));
		hosts = string_table("eventgrid endpoint hosts", sizeof(EgHost));
	}
	t = hash_search(eg_targets_table, &url, HASH_ENTER, &found);
	if (!found)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		char	   *key = eg_url_host_key(url);
		EgHost	   *h;

		memset(t, 0, sizeof(EgTarget));
		t->url = pstrdup(url);
		h = hash_search(hosts, &key, HASH_ENTER, &found);
		if (!found)
		{
			memset(h, 0, sizeof(EgHost));
			h->key = key;
			h->hash = hash_bytes_extended((const unsigned char *) key, (int) strlen(key), 0);
			h->tls = strncmp(key, "https://", 8) == 0;
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

/*
 * The first request of host h that need not wait for its bearer token
 * (delivery_auth.c), or NULL; *prev is the request before it.  One whose
 * endpoint is on probation does not wait: it is held without being sent.
 * The requests of a subscription share their credentials, so they wait or
 * go together and keep their order.
 */
static EgRequest *
first_ready(EgHost *h, TimestampTz now, EgRequest **prev, EgAuthState *auth)
{
	*prev = NULL;
	for (EgRequest *req = h->head; req != NULL; *prev = req, req = req->next)
	{
		if (req->token_use == NULL || eg_health_holds(req->target, now))
		{
			*auth = EG_AUTH_READY;
			return req;
		}
		*auth = eg_auth_state(req);
		if (*auth != EG_AUTH_WAIT)
			return req;
	}
	return NULL;
}

/*
 * The next request to take from the queues, hosts in turn (*what says
 * which): one its endpoint holds back (EG_NEXT_HOLD: the caller records
 * its deliveries as held and frees it), one whose bearer token could not
 * be had (EG_NEXT_NO_TOKEN: the caller records its deliveries as failed),
 * or, while may_send, one that may be sent now (EG_NEXT_SEND: its host
 * below eventgrid.max_requests_per_endpoint; counted in flight from here,
 * and the probe of an endpoint whose probation time is over).  Requests
 * waiting for their bearer token are passed over.  NULL when there is
 * none.
 */
EgRequest *
eg_target_next(TimestampTz now, bool may_send, EgNext *what)
{
	EgHost	   *start = ring;
	EgHost	   *h = ring;

	while (h != NULL)
	{
		EgHost	   *next = h->ring_next;
		EgRequest  *prev;
		EgRequest  *req;
		EgAuthState auth;

		if (h->head == NULL)
		{
			ring_remove(h);
			if (ring == NULL)
				return NULL;
			if (h == start)
				start = next;
			h = next;
			continue;
		}
		req = first_ready(h, now, &prev, &auth);
		*what = req == NULL ? EG_NEXT_SEND : eg_health_holds(req->target, now) ? EG_NEXT_HOLD
			: auth == EG_AUTH_FAILED ? EG_NEXT_NO_TOKEN : EG_NEXT_SEND;
		if (req != NULL &&
			(*what != EG_NEXT_SEND || (may_send && !learning_protocol(h, now) && host_acquire(h))))
		{
			if (prev != NULL)
				prev->next = req->next;
			else
				h->head = req->next;
			if (h->tail == req)
				h->tail = prev;
			req->next = NULL;
			h->queued--;
			h->queued_bytes -= req->bytes;
			queued_total--;
			if (h->skipped && !backed_up(h))
			{
				h->skipped = false;
				unblocked = true;
			}
			if (*what != EG_NEXT_SEND)
				req->target->waiting--;
			else
			{
				eg_health_probe_started(req->target, req);
				if (h->tls && h->http_version == 0 && h->in_flight == 1)
					h->first_sent_at = now;
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

	host_release(h);
	eg_health_probe_unsent(req->target, req);
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
 * Accounts for a request that was sent and has finished (req->transport
 * and req->http_status set): its host has a free slot, and the endpoint's
 * health follows the outcome.  Returns whether the outcome ended a
 * probation.
 */
bool
eg_target_finished(EgRequest *req, TimestampTz now)
{
	EgTarget   *t = req->target;

	host_release(t->host);
	/* what the host speaks, as its last answer says (none: as HTTP/1.1, nothing waits) */
	t->host->http_version = req->http_version != 0 ? req->http_version : Max(t->host->http_version, 1);
	t->waiting--;
	t->last_used = GetCurrentTimestamp();
	return eg_health_after_attempt(t, req, now);
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

/*
 * The event subscriptions whose requests wait on the hosts that only_backed_up
 * says (backed-up hosts, marked skipped; or every host), palloc'd, sorted,
 * distinct; count returned.
 */
static int
waiting_subscriptions(bool only_backed_up, int64 **subs)
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
		if (!only_backed_up || backed_up(h))
			cap += h->queued;
		h = h->ring_next;
	} while (h != ring);
	if (cap == 0)
		return 0;
	out = palloc(cap * sizeof(int64));
	do
	{
		if (!only_backed_up || backed_up(h))
		{
			if (only_backed_up)
				h->skipped = true;
			for (EgRequest *r = h->head; r; r = r->next)
				out[n++] = r->subscription_id;
		}
		h = h->ring_next;
	} while (h != ring);
	*subs = out;
	return eg_sort_distinct_int64(out, n);
}

/*
 * The event subscriptions whose requests wait on backed-up hosts, for the
 * next claim to leave out (palloc'd, sorted, distinct; count returned).
 */
int
eg_targets_skip_list(int64 **subs)
{
	return waiting_subscriptions(true, subs);
}

/* The event subscriptions whose requests wait, not started (palloc'd, sorted, distinct; count returned). */
int
eg_targets_queued_subscriptions(int64 **subs)
{
	return waiting_subscriptions(false, subs);
}

/*
 * Takes the waiting requests that take(req, arg) picks out of their
 * queues, in order, and returns them linked by next: they are no longer
 * waiting for this worker to send them.
 */
EgRequest *
eg_targets_take(bool (*take) (const EgRequest *req, void *arg), void *arg)
{
	EgRequest  *taken = NULL;
	EgRequest **taken_tail = &taken;
	EgHost	   *h = ring;

	if (h == NULL)
		return NULL;
	do
	{
		EgRequest **link = &h->head;

		h->tail = NULL;
		while (*link != NULL)
		{
			EgRequest  *req = *link;

			if (!take(req, arg))
			{
				h->tail = req;
				link = &req->next;
				continue;
			}
			*link = req->next;
			req->next = NULL;
			*taken_tail = req;
			taken_tail = &req->next;
			h->queued--;
			h->queued_bytes -= req->bytes;
			req->target->waiting--;
			queued_total--;
		}
		if (h->skipped && !backed_up(h))
		{
			h->skipped = false;
			unblocked = true;
		}
		h = h->ring_next;
	} while (h != ring);
	return taken;
}

/* Has a host that a claim left out drained below its mark since the last call (claim again)? */
bool
eg_targets_unblocked(void)
{
	bool		was = unblocked;

	unblocked = false;
	return was;
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
	if (eg_targets_table == NULL)
		return 0;
	*out = palloc(cap * sizeof(EgHealth));
	hash_seq_init(&seq, eg_targets_table);
	while ((t = hash_seq_search(&seq)) != NULL)
	{
		if (!t->dirty)
			continue;
		if (n == cap)
		{
			cap *= 2;
			*out = repalloc(*out, cap * sizeof(EgHealth));
		}
		eg_health_to_row(t, &(*out)[n++]);
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
		EgTarget   *t = hash_search(eg_targets_table, &url, HASH_FIND, NULL);

		if (t)
			t->dirty = false;
	}
	eg_targets_sweep(GetCurrentTimestamp());
}

/* Takes over the health of endpoints an earlier run of a worker wrote (eg_health_from_row). */
void
eg_targets_load(const EgHealth *rows, int n)
{
	for (int i = 0; i < n; i++)
		eg_health_from_row(eg_target(rows[i].endpoint), &rows[i]);
}

/*
 * Gives back this worker's share of the shared per-host counts: in an
 * exit callback, when the requests it still had in flight go with it.
 */
void
eg_targets_release_hosts(void)
{
	HASH_SEQ_STATUS seq;
	EgHost	   *h;

	if (hosts == NULL)
		return;
	hash_seq_init(&seq, hosts);
	while ((h = hash_seq_search(&seq)) != NULL)
		while (h->shared_in_flight > 0)
			host_release(h);
}
