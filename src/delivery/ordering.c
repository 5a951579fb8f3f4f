/*
 * ordering.c - a delivery worker's share of ordered delivery (SPEC 13):
 * the first attempts of an ordered event subscription are claimed from its
 * position like unordered ones, by one worker at a time (the position's
 * lease_owner, store_claim.c), and this worker keeps each key's events in
 * publish order in memory:
 *
 * - a request carrying an event of a key waits until every earlier request
 *   of that key this worker holds is decided (at most one request of a key
 *   in flight; a batch may carry a run of one key, in order);
 * - when an event of a key does not get through (a retry: a failed attempt,
 *   probation, a token that could not be had, a request put back unsent),
 *   the key is parked: every later event of it this worker holds is
 *   decided EG_ACTION_WAIT unsent (delivery_record.c, eg_delivery_settled),
 *   and the record writes them into the retries behind it in the order
 *   decided (eventgrid._park_ordering_keys), where the retry claim takes
 *   one at a time per key.  A claim marks the events of keys that already
 *   wait there (EgClaimedRow.parked): such an event gets a request that is
 *   never sent, so that it goes behind, in its turn, whatever this worker
 *   still holds of its key (a batch held back by another of its keys);
 * - an ordered chunk is recorded only with or after every earlier ordered
 *   chunk of its subscription, so that a key's parked events reach the
 *   retries in publish order.
 *
 * Nothing is written per event on the happy path but what unordered
 * delivery writes.  This file only keeps the state: its callers queue,
 * decide and record.
 */
#include "delivery/delivery.h"

#include "utils/hsearch.h"
#include "utils/memutils.h"

/* One key of an ordered subscription that this worker holds events of. */
typedef struct KeyState
{
	int64		subscription_id;	/* hash key, with key_hash */
	int64		key_hash;
	EgRequest  *tail;			/* the last undecided request with an event of this key, or NULL */
	int			parked;			/* its deliveries decided to wait (retry or wait) and not recorded */
} KeyState;

/*
 * A request's place in the order of its keys, for a request that waits or
 * is waited for (kept beside the request: EgRequest is sized to 1 kB, an
 * allocation size of its own).
 */
typedef struct Place
{
	EgRequest  *req;			/* hash key */
	int			waits;			/* undecided requests before it sharing a key */
	int			nafter;
	int			cap;
	EgRequest **after;			/* requests waiting for it */
} Place;

static HTAB *keys = NULL;
static HTAB *places = NULL;
static int	nwaiting = 0;		/* requests waiting for earlier ones of their keys */

/* the ordered chunks claimed and not recorded, in claim order */
static EgChunk **chunks = NULL;
static int	nchunks = 0;
static int	chunks_cap = 0;

static KeyState *
key_of(const EgDelivery *d, bool create)
{
	struct
	{
		int64		sub;
		int64		hash;
	}			k;
	bool		found;
	KeyState   *s;

	if (keys == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		ctl.keysize = 2 * sizeof(int64);
		ctl.entrysize = sizeof(KeyState);
		keys = hash_create("eventgrid ordering keys", 256, &ctl, HASH_ELEM | HASH_BLOBS);
	}
	k.sub = d->out.subscription_id;
	k.hash = d->key_hash;
	s = hash_search(keys, &k, create ? HASH_ENTER : HASH_FIND, &found);
	if (create && !found)
	{
		s->tail = NULL;
		s->parked = 0;
	}
	return s;
}

static void
forget_if_idle(KeyState *s)
{
	if (s->tail == NULL && s->parked == 0)
		hash_search(keys, s, HASH_REMOVE, NULL);
}

/* req's place (made when create and it has none, else NULL) */
static Place *
place_of(EgRequest *req, bool create)
{
	bool		found;
	Place	   *p;

	if (places == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		ctl.keysize = sizeof(EgRequest *);
		ctl.entrysize = sizeof(Place);
		places = hash_create("eventgrid ordering places", 256, &ctl, HASH_ELEM | HASH_BLOBS);
	}
	p = hash_search(places, &req, create ? HASH_ENTER : HASH_FIND, &found);
	if (create && !found)
	{
		p->waits = 0;
		p->nafter = 0;
		p->cap = 0;
		p->after = NULL;
	}
	return p;
}

/* req waits for before (once, whatever keys they share) */
static void
link_after(EgRequest *before, EgRequest *req)
{
	Place	   *b = place_of(before, true);

	for (int i = 0; i < b->nafter; i++)
		if (b->after[i] == req)
			return;
	if (b->nafter == b->cap)
	{
		b->cap = Max(4, b->cap * 2);
		b->after = b->after == NULL
			? MemoryContextAlloc(TopMemoryContext, b->cap * sizeof(EgRequest *))
			: repalloc(b->after, b->cap * sizeof(EgRequest *));
	}
	b->after[b->nafter++] = req;
	place_of(req, true)->waits++;
}

/* Whether a key of req is parked: then req waits in the retries behind it, unsent. */
bool
eg_ordering_parked(EgRequest *req)
{
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];
		KeyState   *s = d->keyed ? key_of(d, false) : NULL;

		if (s != NULL && s->parked > 0)
			return true;
	}
	return false;
}

/*
 * req is decided (every delivery has its action): its keys go on.  Keys of
 * its deliveries that are to be retried (or wait) are parked until those
 * are recorded.  Returns the requests that waited only for it, *n of them
 * (palloc'd): each may go now, unless a key of it is parked
 * (eg_ordering_parked()).
 */
EgRequest **
eg_ordering_done(EgRequest *req, int *n)
{
	Place	   *p = place_of(req, false);
	EgRequest **free_now;

	*n = 0;
	if (keys == NULL)
		return NULL;
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];
		KeyState   *s;

		if (!d->keyed || (s = key_of(d, false)) == NULL)
			continue;
		if ((d->out.action == EG_ACTION_RETRY || d->out.action == EG_ACTION_WAIT) && !d->parked_key)
		{
			s->parked++;
			d->parked_key = true;
		}
		if (s->tail == req)
			s->tail = NULL;
	}
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];
		KeyState   *s;

		if (d->keyed && (s = key_of(d, false)) != NULL)
			forget_if_idle(s);
	}
	if (p == NULL)
		return NULL;
	free_now = palloc(Max(p->nafter, 1) * sizeof(EgRequest *));
	for (int i = 0; i < p->nafter; i++)
	{
		EgRequest  *next = p->after[i];

		if (--place_of(next, false)->waits > 0)
			continue;
		nwaiting--;
		free_now[(*n)++] = next;
	}
	if (p->after)
		pfree(p->after);
	hash_search(places, &req, HASH_REMOVE, NULL);
	return free_now;
}

/*
 * A request of a claim that has committed, before it is queued: EG_ORDER_GO
 * when it may go now; EG_ORDER_WAIT when it waits for earlier requests of
 * its keys (eg_ordering_done() frees it); EG_ORDER_PARK when a key of it is
 * parked (the caller decides its deliveries EG_ACTION_WAIT and then calls
 * eg_ordering_done()).
 */
EgOrderVerdict
eg_ordering_admit(EgRequest *req)
{
	bool		keyed = false;
	Place	   *p;

	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];
		KeyState   *s;

		if (!d->keyed)
			continue;
		keyed = true;
		s = key_of(d, true);
		if (s->tail != NULL && s->tail != req)
			link_after(s->tail, req);
		s->tail = req;
		if (d->claim_parked && !d->parked_key)
		{
			/* its key waits in the retries: so will it, behind what this worker holds of the key */
			s->parked++;
			d->parked_key = true;
		}
	}
	if (!keyed)
		return EG_ORDER_GO;
	if ((p = place_of(req, false)) != NULL && p->waits > 0)
	{
		nwaiting++;
		return EG_ORDER_WAIT;
	}
	return eg_ordering_parked(req) ? EG_ORDER_PARK : EG_ORDER_GO;
}

/* d, a delivery whose key it parked, is recorded: its key may go on. */
void
eg_ordering_recorded(EgDelivery *d)
{
	KeyState   *s;

	if (!d->parked_key)
		return;
	d->parked_key = false;
	if ((s = key_of(d, false)) == NULL)
		return;
	s->parked--;
	forget_if_idle(s);
}

/* An ordered chunk claimed (in claim order). */
void
eg_ordering_chunk_claimed(EgChunk *c)
{
	if (nchunks == chunks_cap)
	{
		chunks_cap = Max(8, chunks_cap * 2);
		chunks = chunks == NULL ? MemoryContextAlloc(TopMemoryContext, chunks_cap * sizeof(EgChunk *))
			: repalloc(chunks, chunks_cap * sizeof(EgChunk *));
	}
	chunks[nchunks++] = c;
}

/*
 * Whether chunk c may be recorded now: every delivery of it is decided,
 * and, of an ordered subscription, every earlier ordered chunk of the same
 * subscription too (they are recorded together or before).
 */
bool
eg_ordering_chunk_ready(const EgChunk *c)
{
	if (c->undecided > 0)
		return false;
	if (!c->ordered)
		return true;
	for (int i = 0; i < nchunks && chunks[i] != c; i++)
		if (chunks[i]->subscription_id == c->subscription_id && chunks[i]->undecided > 0)
			return false;
	return true;
}

/* Chunk c is recorded (or dropped with its claim): forgotten. */
void
eg_ordering_chunk_gone(const EgChunk *c)
{
	for (int i = 0; i < nchunks; i++)
		if (chunks[i] == c)
		{
			memmove(&chunks[i], &chunks[i + 1], (nchunks - i - 1) * sizeof(EgChunk *));
			nchunks--;
			return;
		}
}

/*
 * Subscriptions whose waiting requests must not be sent when their turn
 * comes (a change made them stale: eg_ordering_follow()), and how they end
 * then; forgotten once nothing waits.
 */
typedef struct Stop
{
	int64		subscription_id;
	EgAction	action;			/* EG_ACTION_RETRY (held, endpoint changed) or EG_ACTION_GONE */
} Stop;

static Stop *stops = NULL;
static int	nstops = 0;
static int	stops_cap = 0;

/*
 * The ordered subscriptions this worker holds requests of (sorted, each
 * once; palloc'd in *ids), for following changes to them.
 */
int
eg_ordering_subscriptions(int64 **ids)
{
	HASH_SEQ_STATUS it;
	KeyState   *s;
	int			n = 0;

	*ids = NULL;
	if (keys == NULL || hash_get_num_entries(keys) == 0)
		return 0;
	*ids = palloc(hash_get_num_entries(keys) * sizeof(int64));
	hash_seq_init(&it, keys);
	while ((s = hash_seq_search(&it)) != NULL)
		if (s->tail != NULL)
			(*ids)[n++] = s->subscription_id;
	return eg_sort_distinct_int64(*ids, n);
}

/*
 * Event subscriptions changed: fate(req, arg) says of the last request of
 * each key (all of a subscription's share its endpoint and settings)
 * whether its subscription's waiting requests may still be sent
 * (EG_ACTION_UNDECIDED) or end unsent when their turn comes (RETRY: held,
 * or sent elsewhere now; GONE: dropped); eg_ordering_stopped() tells.
 */
void
eg_ordering_follow(EgAction (*fate) (const EgRequest *req, void *arg), void *arg)
{
	HASH_SEQ_STATUS it;
	KeyState   *s;

	if (keys == NULL)
		return;
	hash_seq_init(&it, keys);
	while ((s = hash_seq_search(&it)) != NULL)
	{
		EgAction	action;
		int			i;

		if (s->tail == NULL || (action = fate(s->tail, arg)) == EG_ACTION_UNDECIDED)
			continue;
		for (i = 0; i < nstops && stops[i].subscription_id != s->subscription_id; i++)
			;
		if (i == nstops)
		{
			if (nstops == stops_cap)
			{
				stops_cap = Max(8, stops_cap * 2);
				stops = stops == NULL ? MemoryContextAlloc(TopMemoryContext, stops_cap * sizeof(Stop))
					: repalloc(stops, stops_cap * sizeof(Stop));
			}
			nstops++;
		}
		stops[i].subscription_id = s->subscription_id;
		stops[i].action = action;
	}
}

/* How a waiting request of subscription sub ends when its turn comes: EG_ACTION_UNDECIDED, it is sent. */
EgAction
eg_ordering_stopped(int64 sub)
{
	if (nwaiting == 0)
		nstops = 0;
	for (int i = 0; i < nstops; i++)
		if (stops[i].subscription_id == sub)
			return stops[i].action;
	return EG_ACTION_UNDECIDED;
}

/* Requests waiting for earlier ones of their keys (the worker's status). */
int
eg_ordering_waiting(void)
{
	return nwaiting;
}
