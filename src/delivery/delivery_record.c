/*
 * delivery_record.c - what came of each delivery, and writing it back
 * (SPEC sections 3, 4, 6 and 7).  After each attempt (or each request an
 * endpoint's probation held back) eg_decide() says whether the delivery is
 * done, retried when, or ended; the attempt is kept for the attempt
 * history.  Decided deliveries are recorded in sets of hundreds, a chunk of
 * first attempts once all of its deliveries are decided, in one unit of
 * work with the endpoints' health.
 *
 * A record that fails is tried again, its outcomes kept in memory.  If it
 * fails once, the next records write each event subscription's outcomes,
 * and each endpoint's health, in a subtransaction of its own, so that one
 * subscription or endpoint whose rows cannot be written (a row too large
 * for an index, a constraint) cannot stop the others being recorded; what
 * failed stays in memory and is tried again with the next record, its
 * event subscription claims nothing new meanwhile (its events wait in the
 * database), and the error is logged once.  Once a record succeeds whole,
 * records are made in one piece again.
 */
#include "delivery/delivery.h"
#include "delivery/endpoint.h"
#include "store/worker.h"

#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/*
 * Delivery attempts made and not yet written to the attempt history, in
 * their own memory (reset once all are written); written with the next
 * outcomes.
 */
static MemoryContext history_cxt = NULL;
static EgAttempt *history = NULL;
static int	history_n = 0;
static int	history_cap = 0;

#define EG_HELD_RETRY_MS 1000	/* outcomes an isolated record could not write: tried again after this */

/* the last errors an isolated record of outcomes, and of endpoint health, failed with */
static char *last_outcome_error = NULL;
static char *last_health_error = NULL;

/*
 * Queues a decided delivery for recording.  A retry may be recorded at
 * once; a first attempt once every delivery of its chunk is decided.
 */
void
eg_delivery_push(EgDelivery *d)
{
	int			ready = d->chunk == NULL ? 1 : (--d->chunk->undecided == 0 ? d->chunk->count : 0);

	if (eg_dw.recordable_n == 0 && ready > 0)
		eg_dw.first_unrecorded_at = GetCurrentTimestamp();
	eg_dw.recordable_n += ready;
	if (eg_dw.to_record_n == eg_dw.to_record_cap)
	{
		eg_dw.to_record_cap = Max(64, eg_dw.to_record_cap * 2);
		eg_dw.to_record = eg_dw.to_record == NULL
			? MemoryContextAlloc(TopMemoryContext, eg_dw.to_record_cap * sizeof(EgDelivery *))
			: repalloc(eg_dw.to_record, eg_dw.to_record_cap * sizeof(EgDelivery *));
	}
	eg_dw.to_record[eg_dw.to_record_n++] = d;
}

/*
 * Applies eg_decide() to a delivery after an attempt that started at
 * started, or (transport EG_TRANSPORT_HELD) one its endpoint's probation
 * held back: that counts as an attempt with outcome Probation, but no
 * request was sent.  retry_after_s: the answer's Retry-After in seconds (0:
 * none), capped here by eventgrid.max_retry_after.
 */
void
eg_delivery_decide(EgDelivery *d, EgTransport transport, int http_status, int64 retry_after_s,
				   TimestampTz started, TimestampTz now)
{
	EgDecision	dec = eg_decide(d->profile, d->attempts, d->max_attempts, transport, http_status,
								eg_retry_jitter_percent, eg_random_fraction(),
								Min(retry_after_s, (int64) eg_max_retry_after_s) * 1000);

	d->out.action = dec.action;
	d->out.outcome = dec.outcome;
	d->out.http_status = dec.http_status;
	d->out.attempted = transport != EG_TRANSPORT_HELD;
	d->out.attempts_after = dec.attempts_after;
	d->out.attempted_at = started;
	d->out.reason = dec.reason;
	if (dec.action == EG_ACTION_RETRY)
		d->out.next_at = now + dec.delay_ms * 1000;
	eg_delivery_push(d);
}

/*
 * Ends a delivery without an attempt now: TTL ran out, attempts used up,
 * its subscription gone (EG_ACTION_GONE), or (reason NonRetriableError
 * with outcome InvalidHeader) a request that may not be sent.  Recorded
 * once the claim commits; the last outcome stays the previous attempt's
 * unless outcome names a new one.
 */
void
eg_delivery_finish_unattempted(EgDelivery *d, EgAction action, EgFinalReason reason, EgOutcomeCode outcome)
{
	d->out.action = action;
	d->out.reason = reason;
	d->out.attempted = false;
	d->out.outcome = outcome != EG_OUTCOME_NONE ? outcome : d->prev_outcome;
	d->out.http_status = outcome != EG_OUTCOME_NONE ? 0 : d->prev_http_status;
	d->out.attempted_at = outcome != EG_OUTCOME_NONE ? eg_now() : d->prev_attempted_at;
	d->out.attempts_after = d->attempts;
}

/* A copy of len bytes of text fit for the history, kept in its context (eg_printable_copy). */
static char *
printable_copy_n(const char *text, int len)
{
	MemoryContext old = MemoryContextSwitchTo(history_cxt);
	char	   *copy = eg_printable_copy(text, len);

	MemoryContextSwitchTo(old);
	return copy;
}

static char *
printable_copy(const char *text)
{
	return printable_copy_n(text, strlen(text));
}

/*
 * Keeps the attempt a request made (or, transport EG_TRANSPORT_HELD, that
 * its endpoint's probation held back) for the attempt history, as
 * eventgrid.attempt_history says.  Called before its deliveries are decided.
 */
void
eg_delivery_remember_attempt(EgRequest *req, TimestampTz started)
{
	EgAttempt  *a;
	int64	   *ids;
	bool		delivered = eg_outcome_of(req->transport, req->http_status) == EG_OUTCOME_DELIVERED;

	if (eg_attempt_history == EG_HISTORY_OFF ||
		(eg_attempt_history == EG_HISTORY_FAILURES && delivered) || req->count == 0)
		return;
	if (history_cxt == NULL)
		history_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid attempt history",
											ALLOCSET_DEFAULT_SIZES);
	if (history_n == history_cap)
	{
		history_cap = Max(64, history_cap * 2);
		history = history == NULL
			? MemoryContextAlloc(TopMemoryContext, history_cap * sizeof(EgAttempt))
			: repalloc(history, history_cap * sizeof(EgAttempt));
	}
	a = &history[history_n++];
	ids = MemoryContextAlloc(history_cxt, req->count * sizeof(int64));
	a->event_sources = NULL;
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];

		ids[k] = d->out.event_id;
		if (d->source != NULL)
		{
			if (a->event_sources == NULL)
				a->event_sources = MemoryContextAllocZero(history_cxt, req->count * sizeof(char *));
			((const char **) a->event_sources)[k] = MemoryContextStrdup(history_cxt, d->source);
		}
	}
	a->attempted_at = started;
	a->subscription_id = req->subscription_id;
	a->subscription_name = MemoryContextStrdup(history_cxt, req->subscription_name);
	a->topic = MemoryContextStrdup(history_cxt, req->topic);
	a->event_ids = ids;
	a->nevents = req->count;
	a->attempt = ((EgDelivery *) req->items[0])->attempts + 1;
	a->outcome = eg_outcome_of(req->transport, req->http_status);
	a->http_status = eg_http_recorded_status(req);	/* the status line's; none for a broker's reply */
	if (req->transport == EG_TRANSPORT_HELD)
	{
		a->duration_ms = -1;
		a->error = "not sent: the endpoint is on probation (delayed delivery)";
		a->response_body = NULL;
	}
	else
	{
		a->duration_ms = req->duration_ms;
		if (req->transport != EG_TRANSPORT_OK)
			a->error = printable_copy(req->errbuf[0] ? req->errbuf : eg_outcome_name(a->outcome));
		else if (req->retry_after_s > 0 && !delivered)
		{
			MemoryContext old = MemoryContextSwitchTo(history_cxt);

			a->error = req->retry_after_s > eg_max_retry_after_s
				? psprintf("Retry-After: " INT64_FORMAT " s, taken as %d s (eventgrid.max_retry_after)",
						   req->retry_after_s, eg_max_retry_after_s)
				: psprintf("Retry-After: " INT64_FORMAT " s", req->retry_after_s);
			MemoryContextSwitchTo(old);
		}
		else
			a->error = NULL;
		/* why the receiver failed it, in its own words */
		a->response_body = req->transport == EG_TRANSPORT_OK && !delivered && req->response_head_len > 0
			? printable_copy_n(req->response_head, req->response_head_len) : NULL;
	}
}

/* Forgets the attempts kept for the history (written, or nowhere to write them). */
static void
forget_attempts(void)
{
	history_n = 0;
	if (history_cxt)
		MemoryContextReset(history_cxt);
}

/*
 * The retry d no longer belongs to the wave it was sent in (it was
 * recorded, or is to be sent again in another): a wave none of whose
 * retries is left has its in-flight record forgotten with the next one
 * written.
 */
void
eg_delivery_leave_wave(EgDelivery *d)
{
	if (d->wave && --d->wave->remaining == 0)
	{
		if (eg_dw.waves_done_n == eg_dw.waves_done_cap)
		{
			eg_dw.waves_done_cap = Max(16, eg_dw.waves_done_cap * 2);
			eg_dw.waves_done = eg_dw.waves_done == NULL
				? MemoryContextAlloc(TopMemoryContext, eg_dw.waves_done_cap * sizeof(int64))
				: repalloc(eg_dw.waves_done, eg_dw.waves_done_cap * sizeof(int64));
		}
		eg_dw.waves_done[eg_dw.waves_done_n++] = d->wave->no;
		pfree(d->wave);
	}
	d->wave = NULL;
}

static void
release_claim_row(EgDelivery *d)
{
	EgClaim    *claim = d->claim;

	eg_dw.bytes_held -= d->bytes;
	eg_delivery_leave_wave(d);
	eg_ordering_recorded(d);
	if (d->chunk != NULL && d->chunk->ordered)
		eg_ordering_chunk_gone(d->chunk);
	if (--claim->unrecorded == 0)
		eg_delivery_claim_gone(claim);
}

/*
 * Runs work(arg) in a subtransaction of the open unit of work; false,
 * with the subtransaction rolled back, if it raised an ERROR, which is
 * logged unless it is *last, the one logged last for this kind of work.
 */
static bool
in_subtransaction(void (*work) (void *arg), void *arg, const char *what, char **last)
{
	ErrorData  *edata = eg_try(work, arg);

	if (edata == NULL)
		return true;
	if (*last == NULL || strcmp(*last, edata->message) != 0)
	{
		ereport(LOG,
				(errmsg("eventgrid: recording %s failed: %s", what, edata->message),
				 errdetail("The other event subscriptions and endpoints are recorded; this is tried again with the next record, and its event subscription claims nothing new meanwhile.")));
		if (*last)
			pfree(*last);
		*last = MemoryContextStrdup(TopMemoryContext, edata->message);
	}
	FreeErrorData(edata);
	return false;
}

/* One event subscription's share of an isolated record. */
typedef struct EgSubRecord
{
	EgOutcome **outcomes;
	int			n;
	int64	   *chunks;
	int			nchunks;
	EgAttempt  *attempts;
	int			nattempts;
	TimestampTz earliest;
} EgSubRecord;

static void
record_one_subscription(void *arg)
{
	EgSubRecord *r = arg;

	r->earliest = eg_store_record(r->outcomes, r->n, eg_dw.lease_owner, r->chunks, r->nchunks,
								  r->attempts, r->nattempts);
}

static void
save_one_health(void *arg)
{
	eg_store_save_health((const EgHealth *) arg, 1, eg_now());
}

static void
skip_subscription(int64 sub, bool skip)
{
	int			i;

	for (i = 0; i < eg_dw.poisoned_n && eg_dw.poisoned[i] != sub; i++)
		;
	if (!skip && i < eg_dw.poisoned_n)
		eg_dw.poisoned[i] = eg_dw.poisoned[--eg_dw.poisoned_n];
	else if (skip && i == eg_dw.poisoned_n)
	{
		if (eg_dw.poisoned_n == eg_dw.poisoned_cap)
		{
			eg_dw.poisoned_cap = Max(8, eg_dw.poisoned_cap * 2);
			eg_dw.poisoned = eg_dw.poisoned == NULL
				? MemoryContextAlloc(TopMemoryContext, eg_dw.poisoned_cap * sizeof(int64))
				: repalloc(eg_dw.poisoned, eg_dw.poisoned_cap * sizeof(int64));
		}
		eg_dw.poisoned[eg_dw.poisoned_n++] = sub;
	}
}

/*
 * The isolated record: each event subscription among the outcomes
 * done[0..n) and the attempts kept for the history, and then each endpoint
 * health[0..nhealth), in a subtransaction of its own.  recorded[i] says
 * whether done[i] was written; the attempts written are forgotten, those
 * of a subscription that failed kept; *health_ok[k] whether health[k] was.
 * Returns the earliest retry time recorded.
 */
static TimestampTz
record_isolated(EgDelivery **done, int n, const int64 *chunks, int nchunks, bool *recorded,
				const EgHealth *health, int nhealth, bool *health_ok)
{
	TimestampTz earliest = DT_NOEND;
	int64	   *subs = palloc((n + history_n + 1) * sizeof(int64));
	int			nsubs = 0;
	bool	   *attempt_written = palloc0((history_n + 1) * sizeof(bool));
	int			kept = 0;

	for (int i = 0; i < n + history_n; i++)
	{
		int64		sub = i < n ? done[i]->out.subscription_id : history[i - n].subscription_id;
		int			k;

		for (k = 0; k < nsubs && subs[k] != sub; k++)
			;
		if (k == nsubs)
			subs[nsubs++] = sub;
	}
	for (int k = 0; k < nsubs; k++)
	{
		EgSubRecord r = {0};
		char		what[128];

		r.outcomes = palloc((n + 1) * sizeof(EgOutcome *));
		r.chunks = palloc((nchunks + 1) * sizeof(int64));
		r.attempts = palloc((history_n + 1) * sizeof(EgAttempt));
		for (int i = 0; i < n; i++)
			if (done[i]->out.subscription_id == subs[k])
			{
				r.outcomes[r.n++] = &done[i]->out;
				if (done[i]->chunk && (r.nchunks == 0 || r.chunks[r.nchunks - 1] != done[i]->chunk->no))
					r.chunks[r.nchunks++] = done[i]->chunk->no;
			}
		for (int i = 0; i < history_n; i++)
			if (history[i].subscription_id == subs[k])
				r.attempts[r.nattempts++] = history[i];
		snprintf(what, sizeof(what), "the outcomes of event subscription %lld", (long long) subs[k]);
		if (in_subtransaction(record_one_subscription, &r, what, &last_outcome_error))
		{
			earliest = Min(earliest, r.earliest);
			for (int i = 0; i < n; i++)
				recorded[i] = recorded[i] || done[i]->out.subscription_id == subs[k];
			for (int i = 0; i < history_n; i++)
				attempt_written[i] = attempt_written[i] || history[i].subscription_id == subs[k];
			skip_subscription(subs[k], false);
		}
		else
			skip_subscription(subs[k], true);
	}
	for (int k = 0; k < nhealth; k++)
	{
		char		what[128];

		snprintf(what, sizeof(what), "the health of an endpoint of host %.64s",
				 eg_target(health[k].endpoint)->host->key);
		health_ok[k] = in_subtransaction(save_one_health, (void *) &health[k], what, &last_health_error);
	}
	for (int i = 0; i < history_n; i++)
		if (!attempt_written[i])
			history[kept++] = history[i];
	history_n = kept;
	return earliest;
}

/*
 * Writes back, in one transaction, every decided retry, every chunk of
 * first attempts whose deliveries are all decided, the attempts kept for
 * the history and the health of the endpoints whose health changed.
 * Returns the earliest retry time recorded, or DT_NOEND.  On an ERROR
 * nothing is lost: the deliveries stay decided in memory and the next call
 * writes them, each event subscription on its own (eg_dw.isolate).
 */
TimestampTz
eg_delivery_record(void)
{
	int			nwaves = eg_dw.waves_done_n;
	int			n = 0;
	int			nchunks = 0;
	int			keep = 0;
	TimestampTz earliest = DT_NOEND;
	EgOutcome **outcomes = palloc(Max(eg_dw.to_record_n, 1) * sizeof(EgOutcome *));
	EgDelivery **done = palloc(Max(eg_dw.to_record_n, 1) * sizeof(EgDelivery *));
	bool	   *recorded = palloc0(Max(eg_dw.to_record_n, 1) * sizeof(bool));
	int64	   *chunks = palloc(Max(eg_dw.to_record_n, 1) * sizeof(int64));
	EgHealth   *health;
	int			nhealth = eg_targets_dirty(&health);
	bool	   *health_ok = palloc0(Max(nhealth, 1) * sizeof(bool));
	bool		isolated = eg_dw.isolate;
	int			nok = 0;

	for (int i = 0; i < eg_dw.to_record_n; i++)
	{
		EgDelivery *d = eg_dw.to_record[i];

		if (d->chunk != NULL && !eg_ordering_chunk_ready(d->chunk))
			continue;
		if (d->chunk != NULL && (n == 0 || done[n - 1]->chunk != d->chunk))
		{
			bool		seen = false;

			for (int k = 0; k < nchunks && !seen; k++)
				seen = chunks[k] == d->chunk->no;
			if (!seen)
				chunks[nchunks++] = d->chunk->no;
		}
		outcomes[n] = &d->out;
		done[n++] = d;
	}

	if (!eg_begin_work("eventgrid: recording delivery outcomes"))
	{
		if (eg_store_readiness != EG_READY_MISSING)
			return DT_NOEND;
		/* extension dropped: nothing to record into */
		forget_attempts();
		memset(recorded, true, n * sizeof(bool));
	}
	else
	{
		/*
		 * Outcomes need not wait for the WAL flush: one lost in a crash
		 * leaves its chunk in flight (or its retry leased and in an in-flight
		 * record), so after restart it is charged as Aborted and retried,
		 * which at-least-once delivery allows.
		 */
		eg_dw.recording = true;
		eg_store_no_flush_wait();
		if (!isolated)
		{
			earliest = eg_store_record(outcomes, n, eg_dw.lease_owner, chunks, nchunks, history, history_n);
			eg_store_save_health(health, nhealth, eg_now());
			memset(recorded, true, n * sizeof(bool));
			memset(health_ok, true, nhealth * sizeof(bool));
			history_n = 0;
		}
		else
			earliest = record_isolated(done, n, chunks, nchunks, recorded, health, nhealth, health_ok);
		eg_store_forget_waves(eg_dw.lease_owner, eg_dw.waves_done, nwaves);
		eg_end_work();
		eg_dw.recording = false;
		for (int k = 0; k < nhealth; k++)
			if (health_ok[k])
				health[nok++] = health[k];
		eg_targets_written(health, nok);
		if (history_n == 0)
			forget_attempts();

		/* waves recorded before this call are forgotten now */
		memmove(eg_dw.waves_done, eg_dw.waves_done + nwaves, (eg_dw.waves_done_n - nwaves) * sizeof(int64));
		eg_dw.waves_done_n -= nwaves;

		/* everything written: the next record is made in one piece again */
		eg_dw.isolate = eg_dw.poisoned_n > 0 || nok < nhealth;
	}

	/* keep what could not be recorded yet, in order */
	eg_dw.recordable_n = 0;
	eg_dw.held_n = 0;
	for (int i = 0; i < eg_dw.to_record_n; i++)
	{
		EgDelivery *d = eg_dw.to_record[i];

		if (d->chunk != NULL && !eg_ordering_chunk_ready(d->chunk))
			eg_dw.to_record[keep++] = d;
	}
	for (int i = 0; i < n; i++)
	{
		if (recorded[i])
			release_claim_row(done[i]);
		else
		{
			eg_dw.to_record[keep++] = done[i];
			eg_dw.recordable_n++;
			eg_dw.held_n++;
		}
	}
	eg_dw.to_record_n = keep;
	if (eg_dw.held_n > 0)
		eg_dw.held_until = GetCurrentTimestamp() + (TimestampTz) EG_HELD_RETRY_MS * 1000;
	return earliest;
}

/*
 * How many decided deliveries may be recorded now: outcomes an isolated
 * record could not write wait EG_HELD_RETRY_MS before they are tried again
 * on their own (with others, they go along at once).
 */
int
eg_delivery_recordable(void)
{
	if (eg_dw.held_n > 0 && GetCurrentTimestamp() < eg_dw.held_until)
		return eg_dw.recordable_n - eg_dw.held_n;
	return eg_dw.recordable_n;
}

static void settle(EgRequest *req, bool gone);

/*
 * Ends every delivery of req, a request never sent, without an attempt:
 * action (EG_ACTION_RETRY: due again at once, uncharged; EG_ACTION_GONE: its
 * subscription was dropped; EG_ACTION_WAIT: behind a parked key), and frees
 * its body; eg_delivery_put_back() also settles its keys.
 */
static void
unsent(EgRequest *req, EgAction action)
{
	TimestampTz now = eg_now();

	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];

		eg_delivery_finish_unattempted(d, action, EG_REASON_NONE, EG_OUTCOME_NONE);
		d->out.next_at = now;
		eg_delivery_push(d);
	}
	eg_http_free_body(req);
}

/*
 * A request claimed and not sent goes back (a subscription changed or
 * gone, a worker leaving, a key parked): see unsent(); the requests of its
 * keys that waited for it follow (eg_delivery_settled()).
 */
void
eg_delivery_put_back(EgRequest *req, EgAction action)
{
	unsent(req, action);
	settle(req, action == EG_ACTION_GONE);
}

/*
 * Records the deliveries of a request that could not get its bearer token
 * (the token endpoint failed: SPEC 12): an attempt with outcome
 * GenericError whose error text says what the token endpoint answered,
 * retried on the schedule; it counts against its endpoint's health as any
 * failure does.  Frees the request.
 */
void
eg_delivery_token_failed(EgRequest *req, const char *error, TimestampTz now)
{
	req->transport = EG_TRANSPORT_TOKEN;
	req->http_status = 0;
	req->duration_ms = 0;
	strlcpy(req->errbuf, error, sizeof(req->errbuf));
	eg_delivery_remember_attempt(req, now);
	(void) eg_health_after_attempt(req->target, req, now);
	for (int k = 0; k < req->count; k++)
		eg_delivery_decide(req->items[k], EG_TRANSPORT_TOKEN, 0, 0, now, now);
	eg_http_free_body(req);
	eg_delivery_settled(req);
}

/*
 * Records the deliveries of a request its endpoint's probation holds back
 * (an attempt with outcome Probation, due again on the schedule but not
 * before the probation ends), and frees it.
 */
void
eg_delivery_hold(EgRequest *req, TimestampTz now)
{
	TimestampTz until = eg_target_probation_until(req->target);

	req->transport = EG_TRANSPORT_HELD;
	req->http_status = 0;
	eg_delivery_remember_attempt(req, now);
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];

		eg_delivery_decide(d, EG_TRANSPORT_HELD, 0, 0, now, now);
		/* not due again before the probation ends: that would only be held again */
		if (d->out.action == EG_ACTION_RETRY && d->out.next_at < until)
			d->out.next_at = until;
	}
	eg_http_free_body(req);
	eg_delivery_settled(req);
}

/*
 * The deliveries of req, every one decided, settle its ordering keys (SPEC
 * 13, ordering.c): the requests that waited for it go to their endpoint's
 * queue, or, behind a key parked in the retries, wait there too
 * (EG_ACTION_WAIT), and so on down their own followers.
 */
void
eg_delivery_settled(EgRequest *req)
{
	settle(req, false);
}

/*
 * eg_delivery_settled(); gone: req's subscription was dropped, and the
 * requests that waited for it (of the same subscription) end unsent too.
 */
static void
settle(EgRequest *req, bool gone)
{
	List	   *work = NIL;
	EgRequest  *r = req;

	/* an unordered request has no followers: no list is made for it */
	for (;;)
	{
		int			n;
		EgRequest **next = eg_ordering_done(r, &n);

		for (int i = 0; i < n; i++)
		{
			/* its subscription changed while it waited: it goes back unsent (eg_ordering_follow) */
			EgAction	stop = gone ? EG_ACTION_GONE : eg_ordering_stopped(next[i]->subscription_id);

			if (stop == EG_ACTION_UNDECIDED && !eg_ordering_parked(next[i]))
			{
				eg_target_queue(next[i]);
				continue;
			}
			unsent(next[i], stop != EG_ACTION_UNDECIDED ? stop : EG_ACTION_WAIT);
			work = lappend(work, next[i]);
		}
		if (next)
			pfree(next);
		if (work == NIL)
			return;
		r = linitial(work);
		work = list_delete_first(work);
	}
}


