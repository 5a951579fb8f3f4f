/*
 * delivery_worker.c - a delivery worker's main loop: claim -> deliver ->
 * record (SPEC sections 2, 3, 4 and 7).  The queue's SQL is in store/,
 * turning claims into requests in delivery_claim.c, deciding and recording
 * outcomes in delivery_record.c, the host queues and endpoint health in
 * endpoint_*.c, the status shown in pg_stat_activity in
 * delivery_status.c; this file is the loop and the requests in flight.
 *
 * Claim: due retries and, from each event subscription's position, the
 * next chunk of first attempts; the transaction commits before any network
 * I/O.  Deliver: before requests are handed to libcurl, what they carry is
 * recorded as in flight (durably); libcurl sends many at once on its own
 * thread.  Record: outcomes go back in sets of hundreds, a chunk of first
 * attempts once all of its outcomes are known.
 *
 * Several delivery workers (eventgrid.delivery_workers) share the queue;
 * each owns what it claimed under its pid (lease_owner).  Crashes: a
 * starting worker turns the chunks that workers no longer running left
 * into retries and takes back their leases, charging an attempt (outcome
 * Aborted) only to what was recorded as in flight, what really went to
 * HTTP; the upkeep worker does the same for a worker that exited while the
 * others run on.
 *
 * Errors: any ERROR in a unit of database work aborts that unit only; what
 * HTTP is doing and the outcomes decided but not yet recorded stay in
 * memory, and the unit is tried again after a pause (worker.c).
 */
#include "delivery/delivery.h"
#include "core/rate.h"
#include "delivery/auth.h"
#include "http/token.h"
#include "delivery/endpoint.h"
#include "store/worker.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_RECORD_MIN_ROWS 500
#define EG_RECORD_MAX_DELAY_MS 20
#define EG_BUSY_POLL_MS 5
#define EG_MIN_CLAIM_BYTES (4 * 1024 * 1024)	/* a claim waits until this much of the bound is free */
#define EG_BLOCKED_POLL_MS 1	/* requests queued behind hosts other processes fill: looked at again after this */
#define EG_LOCKED_DUE_RETRY_MS 250	/* due rows exist, but another session locks them */
#define EG_PEER_LOCKED_RETRY_MS 10	/* the same with several delivery workers: most likely a peer's claim */
#define EG_LEAVE_GRACE_MS 3000	/* a worker asked to leave waits this long for the requests it sent */
#define EG_IDLE_POLL_MS 1000		/* a worker with nothing in flight looks this often whether it should leave */

EgDeliveryWorker eg_dw = {.next_chunk_no = 1, .next_wave_no = 1};

/* requests being recorded as in flight; put back in their queues if that fails */
static EgRequest **starting = NULL;
static int	starting_n = 0;

/* the loop's state across rounds (and across an ERROR's longjmp) */
static TimestampTz next_claim_at = 0;
static uint64 finished_total = 0;	/* requests this worker saw finish */
static uint64 finished_at_start = 0;	/* finished_total when start_pending() last ran */
static bool leases_released = false;
static int	last_claim_rows = 0;
static TimestampTz idle_since = 0;	/* 0: busy (it was started for work: idle from its first quiet round) */
static TimestampTz leaving_since = 0;	/* asked to leave, or idle long enough: finishing */
static bool leave_with_work = false;	/* it leaves with work left: wanted again at once */
static TimestampTz active_reported = 0;

/* The generation of event subscription changes this worker has followed. */
static uint64 followed_generation = 0;

/* What became of the subscriptions of the waiting requests (sorted by id). */
typedef struct EgFollowed
{
	EgSubscriptionState *states;
	int			n;
} EgFollowed;

static const EgSubscriptionState *
state_of(const EgFollowed *f, int64 sub)
{
	int			lo = 0;
	int			hi = f->n - 1;

	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;

		if (f->states[mid].id == sub)
			return &f->states[mid];
		if (f->states[mid].id < sub)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/*
 * The endpoint a request goes to as its subscription names it: its
 * target's URL (a Storage queue's request is sent to a Put URL of its own,
 * which may hold a SAS token, never logged), or its URL.
 */
static const char *
request_endpoint(const EgRequest *req)
{
	return req->target != NULL ? eg_target_url(req->target) : req->url;
}

/* A waiting request that must not be sent now: its subscription dropped, held, or sent elsewhere. */
static bool
superseded(const EgRequest *req, void *arg)
{
	const EgSubscriptionState *st = state_of(arg, req->subscription_id);
	const char *endpoint = request_endpoint(req);

	return st != NULL && (st->gone || st->held || (endpoint != NULL && strcmp(st->endpoint, endpoint) != 0));
}

/* What becomes of an ordered subscription's waiting requests, of which req is one (eg_ordering_follow). */
static EgAction
fate(const EgRequest *req, void *arg)
{
	const EgSubscriptionState *st = state_of(arg, req->subscription_id);

	if (st == NULL)
		return EG_ACTION_UNDECIDED;
	return st->gone ? EG_ACTION_GONE : superseded(req, arg) ? EG_ACTION_RETRY : EG_ACTION_UNDECIDED;
}

/*
 * The subscriptions of the requests this worker holds unsent: queued, or
 * waiting for earlier requests of their ordering keys (sorted, each once).
 */
static int
queued_and_ordered_subscriptions(int64 **ids)
{
	int64	   *q;
	int64	   *o;
	int			nq = eg_targets_queued_subscriptions(&q);
	int			no = eg_ordering_subscriptions(&o);
	int			n = 0;
	int			i = 0;
	int			j = 0;

	if (no == 0)
	{
		*ids = q;
		return nq;
	}
	*ids = palloc((nq + no) * sizeof(int64));
	while (i < nq || j < no)
	{
		int64		next = j >= no || (i < nq && q[i] <= o[j]) ? q[i] : o[j];

		if (n == 0 || (*ids)[n - 1] != next)
			(*ids)[n++] = next;
		if (i < nq && q[i] == next)
			i++;
		if (j < no && o[j] == next)
			j++;
	}
	return n;
}

/*
 * A change to event subscriptions committed (pause_delivery(),
 * update_event_subscription(), drop_event_subscription(), drop_topic()):
 * requests this worker claimed for them and has not started are not sent.
 * Their deliveries go back unsent and uncharged: due at once as retries
 * (which the claims pass over while the subscription is paused, and send
 * to its endpoint as it is then), or, for a dropped subscription, nowhere.
 * Requests already started finish.
 */
static void
follow_subscription_changes(void)
{
	uint64		generation;
	int64	   *ids;
	EgFollowed	f;
	EgRequest  *req;

	SpinLockAcquire(&eg_shared->mutex);
	generation = eg_my_db->change_generation;
	SpinLockRelease(&eg_shared->mutex);
	if (generation == followed_generation)
		return;
	/* a subscription created, resumed or changed: its events may be older than the claims' last look */
	eg_store_claim_sweep();
	f.n = queued_and_ordered_subscriptions(&ids);
	if (f.n > 0)
	{
		if (!eg_begin_work("eventgrid: following changed event subscriptions"))
			return;
		f.states = MemoryContextAlloc(eg_round_cxt, f.n * sizeof(EgSubscriptionState));
		eg_store_subscription_states(ids, f.n, f.states);
		/* the endpoints are compared below, after the unit's memory is gone */
		for (int i = 0; i < f.n; i++)
			if (f.states[i].endpoint)
				f.states[i].endpoint = MemoryContextStrdup(eg_round_cxt, f.states[i].endpoint);
		eg_end_work();
		req = eg_targets_take(superseded, &f);
		while (req != NULL)
		{
			EgRequest  *next = req->next;

			eg_delivery_put_back(req, state_of(&f, req->subscription_id)->gone ? EG_ACTION_GONE : EG_ACTION_RETRY);
			req = next;
		}
		/* an ordered subscription's requests waiting for earlier ones of their keys go back when their turn comes */
		eg_ordering_follow(fate, &f);
	}
	followed_generation = generation;
}

/* Earliest due time of retries this worker does not hold, or DT_NOEND. */
static TimestampTz
next_due(void)
{
	TimestampTz result;

	if (!eg_begin_work("eventgrid: looking up the next due delivery"))
		return DT_NOEND;
	result = eg_store_next_due();
	eg_end_work();
	return result;
}

/*
 * Takes back what delivery workers no longer running left (a crash, an
 * earlier run of this worker number, or a restored dump): chunks in flight
 * become retries, leased retries are released;
 * deliveries that were handed to HTTP are charged an attempt with outcome
 * Aborted, the others are not, and all are due at once.  The endpoints'
 * health is taken over.
 */
static bool
release_old_leases(void)
{
	uint64		charged;
	uint64		released;
	EgHealth   *health;
	int			nhealth;

	if (!eg_begin_work("eventgrid: releasing leases of an interrupted run"))
		return false;
	eg_store_recover(eg_dw.lease_owner, eg_now(), eg_attempt_history != EG_HISTORY_OFF, &charged, &released);
	nhealth = eg_store_load_health(&health);
	eg_targets_load(health, nhealth);
	eg_end_work();
	return true;
}

/* Puts the requests being started back in their queues, in order (their in-flight record failed). */
static void
unsend_starting(void)
{
	for (int i = starting_n - 1; i >= 0; i--)
		eg_target_unsend(starting[i]);
	starting_n = 0;
}

/*
 * Hands queued requests to HTTP as slots free up, hosts in turn, each
 * within eventgrid.max_requests_per_endpoint; requests to an endpoint on
 * probation are held instead (SPEC 6).  Before requests go, what they carry
 * is recorded as in flight, committed durably: retries by id, first
 * attempts as the highest event of each chunk sent so far (a chunk's
 * requests go in order, one subscription, one host queue, but for an
 * ordered chunk's, whose keys wait for each other: the mark may then cover
 * events not sent yet, which a crash charges an attempt too).  After a crash exactly
 * these are charged an attempt: requests still queued in memory were never
 * sent.
 */
static void
start_pending(void)
{
	int			room = eg_max_concurrent_requests - eg_http_in_flight();
	int			nrows = 0;
	int			nretries = 0;
	int			nmarks = 0;
	int64	   *ids;
	EgChunkMark *marks;
	EgWave	   *wave = NULL;
	EgRequest  *req;
	TimestampTz now = eg_now();
	EgNext		what;
	int			nstart;

	finished_at_start = finished_total;
	starting = palloc(Max(room, 1) * sizeof(EgRequest *));
	starting_n = 0;
	eg_auth_new_round();
	while ((req = eg_target_next(now, starting_n < room, &what)) != NULL)
	{
		if (what == EG_NEXT_HOLD)
			eg_delivery_hold(req, now);
		else if (what == EG_NEXT_NO_TOKEN)
			eg_delivery_token_failed(req, eg_auth_error(req), now);
		else
		{
			starting[starting_n++] = req;
			nrows += req->count;
		}
	}
	if (starting_n == 0)
		return;

	if (!eg_begin_work("eventgrid: recording requests in flight"))
	{
		unsend_starting();
		return;
	}
	ids = palloc(nrows * sizeof(int64));
	marks = palloc(nrows * sizeof(EgChunkMark));
	for (int i = 0; i < starting_n; i++)
	{
		req = starting[i];
		for (int k = 0; k < req->count; k++)
		{
			EgDelivery *d = (EgDelivery *) req->items[k];
			int			m;

			if (d->chunk == NULL)
			{
				ids[nretries++] = d->out.retry_id;
				continue;
			}
			for (m = 0; m < nmarks && marks[m].chunk != d->chunk->no; m++)
				;
			if (m == nmarks)
			{
				marks[nmarks++].chunk = d->chunk->no;
				marks[m].txid = 0;
				marks[m].event_id = 0;
			}
			/* the highest: an ordered chunk's keys go in parallel, each in order */
			if (d->out.txid > marks[m].txid ||
				(d->out.txid == marks[m].txid && d->out.event_id > marks[m].event_id))
			{
				marks[m].txid = d->out.txid;
				marks[m].event_id = d->out.event_id;
			}
		}
	}
	eg_store_mark_in_flight(eg_dw.lease_owner, eg_dw.next_wave_no, ids, nretries, marks, nmarks);
	eg_store_forget_waves(eg_dw.lease_owner, eg_dw.waves_done, eg_dw.waves_done_n);
	eg_end_work();
	eg_dw.waves_done_n = 0;
	nstart = starting_n;
	starting_n = 0;				/* committed: nothing to put back from here on */

	if (nretries > 0)
	{
		wave = MemoryContextAlloc(TopMemoryContext, sizeof(EgWave));
		wave->no = eg_dw.next_wave_no++;
		wave->remaining = nretries;
	}
	for (int i = 0; i < nstart; i++)
	{
		req = starting[i];
		for (int k = 0; k < req->count; k++)
			if (((EgDelivery *) req->items[k])->chunk == NULL)
				((EgDelivery *) req->items[k])->wave = wave;
		eg_auth_attach(req);
		req->started_at = eg_now();
	}
	eg_http_start(starting, nstart, eg_response_timeout_ms);
}

static void
collect_finished(void)
{
	EgRequest  *req;
	TimestampTz now = eg_now();

	while ((req = eg_http_take_finished()) != NULL)
	{
		finished_total++;
		if (req->token_request)
		{
			eg_auth_token_finished(req);
			continue;
		}
		if (req->transport == EG_TRANSPORT_OK && req->http_status == 401 && eg_auth_refused(req))
		{
			/* its token was refused, not new: sent again at once with a new one, in a new wave */
			for (int k = 0; k < req->count; k++)
				eg_delivery_leave_wave(req->items[k]);
			eg_target_unsend(req);
			continue;
		}
		if (req->transport != EG_TRANSPORT_OK)
			ereport(DEBUG1,
					(errmsg("eventgrid: delivery request to \"%s\" failed: %s", request_endpoint(req),
							req->errbuf[0] ? req->errbuf : eg_outcome_name(eg_outcome_of(req->transport, 0)))));
		eg_target_finished(req, now);
		eg_delivery_remember_attempt(req, req->started_at);
		for (int k = 0; k < req->count; k++)
		{
			EgDelivery *d = (EgDelivery *) req->items[k];

			d->out.duration_ms = req->transport == EG_TRANSPORT_OK ? req->duration_ms : -1;
			d->out.request_head = k == 0;
			eg_delivery_decide(d, req->transport, req->http_status, req->retry_after_s, req->started_at, now);
			/* the status line's, none for a broker's reply (redis_stream.c) */
			d->out.http_status = eg_http_recorded_status(req);
		}
		if (req->keep_body)
			eg_http_free_body(req);
		eg_delivery_settled(req);
	}
}

/*
 * Exit callback: the HTTP thread stops, and the requests this worker had
 * in flight no longer count against their hosts (the pid slot and latch
 * are cleared by worker.c's).
 */
static void
stop_http(int code, Datum arg)
{
	eg_http_shutdown();
	eg_targets_release_hosts();
	eg_token_release_fetches();
}

/*
 * What an ERROR in a unit of work leaves half done is dropped: requests
 * being started go back to their queues, a claim being built is dropped,
 * and a record that failed makes the next ones isolate each event
 * subscription (delivery_record.c).
 */
static void
drop_partial(void)
{
	unsend_starting();
	eg_delivery_drop_claim();
	if (eg_dw.recording)
	{
		eg_dw.recording = false;
		eg_dw.isolate = true;
	}
}

/*
 * Claims in large sets while fewer requests wait than can be in flight, so
 * HTTP never runs dry and each statement's fixed cost is spread over many
 * rows.  Event bytes held stay under eventgrid.max_bytes_in_flight: a
 * claim's result and the requests built from it both exist for a moment,
 * so a claim takes at most half of what is left (and at least one event
 * when nothing is held).  Bytes waiting on a backed-up endpoint host do not
 * count in that half: its subscriptions claim nothing more until it drains
 * (endpoint_queue.c); but a claim never takes more than the limit leaves
 * of all that is held, backed up or not, so that backed-up hosts cannot
 * add up to more (they give theirs back within eventgrid.response_timeout;
 * when every subscription's endpoint is one backed-up host, the old rule
 * let each claim take half the limit again, and the worker held twice the
 * limit).  A claim waits until a quarter of the bound, or
 * EG_MIN_CLAIM_BYTES, is free, so that claims stay large.  A claim is
 * sized by the store's estimate of each delivery (its event's bytes and
 * EG_DELIVERY_OVERHEAD_BYTES); once built, its rows are charged what the
 * claim really holds (delivery_claim.c).  Returns whether a claim was
 * wanted.
 */
static bool
claim_round(TimestampTz now, bool db_ok)
{
	int64		byte_limit = (int64) eg_max_bytes_in_flight_kb * 1024;
	int64		bytes_claimable;
	int			ready;
	int64		backed_up_bytes;
	bool		more;
	bool		locked;
	TimestampTz due;
	int			n;

	last_claim_rows = 0;
	eg_targets_waiting(&ready, &backed_up_bytes);
	bytes_claimable = eg_dw.bytes_held - backed_up_bytes;
	if (!(db_ok && leases_released && !eg_delivery_paused && leaving_since == 0 &&
		  ready < eg_max_concurrent_requests && now >= next_claim_at &&
		  (bytes_claimable == 0 || bytes_claimable < byte_limit / 2) &&
		  byte_limit - eg_dw.bytes_held >= Min(byte_limit / 4, EG_MIN_CLAIM_BYTES)))
		return false;

	eg_rate_reset_next();
	eg_worker_saw_wakes();		/* commits up to here are this claim's to find */
	n = eg_delivery_claim(Min((byte_limit - bytes_claimable) / 2, byte_limit - eg_dw.bytes_held),
						  &more, &locked, &due);
	last_claim_rows = Max(n, 0);
	if (n < 0)
		next_claim_at = 0;		/* eg_db_retry_at holds it back */
	else if (!more)
	{
		/* the next due retry, or the next token of a subscription the claim left waiting for its rate */
		next_claim_at = Min(due != 0 ? due : next_due(), eg_rate_next_at);

		/*
		 * Due retries or positions the claim did not get are locked by
		 * another session (SKIP LOCKED passed them by): look again a little
		 * later, not in a busy loop.  With several delivery workers that
		 * session is most likely another worker's claim, over within
		 * milliseconds.
		 */
		if (next_claim_at <= now || locked)
			next_claim_at = now + (TimestampTz) (eg_delivery_workers > 1 ? EG_PEER_LOCKED_RETRY_MS
												 : EG_LOCKED_DUE_RETRY_MS) * 1000;
	}
	else
		next_claim_at = now;
	return true;
}

/*
 * Records outcomes in sets of hundreds; a smaller set waits at most a few
 * milliseconds, or not at all once nothing is in flight.
 */
static void
record_round(void)
{
	TimestampTz earliest;

	int			ready = eg_delivery_recordable();

	if (GetCurrentTimestamp() < eg_db_retry_at || ready <= 0)
		return;
	if (ready < EG_RECORD_MIN_ROWS &&
		!(eg_http_in_flight() == 0 && eg_targets_queued() == 0) &&
		GetCurrentTimestamp() - eg_dw.first_unrecorded_at < EG_RECORD_MAX_DELAY_MS * 1000)
		return;
	earliest = eg_delivery_record();
	if (earliest < next_claim_at)
		next_claim_at = earliest;
}

/*
 * With nothing in flight, sleeps until the next claim is due, work is
 * queued, a publisher's commit sets the latch, or a database retry is due;
 * with requests in flight, only notes a latch set meanwhile.
 */
static void
idle_wait(void)
{
	TimestampTz now;
	TimestampTz wake_at = next_claim_at;
	long		timeout_ms;
	int			rc;

	if (eg_http_in_flight() > 0)
	{
		if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_claim_at = 0;
			eg_want_upkeep();
		}
		return;
	}
	now = eg_now();
	if (eg_delivery_paused && eg_targets_queued() == 0 && eg_dw.to_record_n == 0)
		wake_at = DT_NOEND;		/* a reload (SIGHUP) sets the latch */
	if (eg_delivery_recordable() > 0 || !leases_released)
		wake_at = Min(wake_at, now);

	/*
	 * Requests still queued with nothing in flight wait for a host whose
	 * eventgrid.max_requests_per_endpoint the requests of other workers (of
	 * this or other databases) fill: no latch tells when one of those ends,
	 * so look again shortly, rather than loop at once (which spun a core in
	 * gettimeofday).  Once a request of this worker finished since the last
	 * start, at once.
	 */
	if (eg_targets_queued() > 0)
		wake_at = Min(wake_at, finished_total != finished_at_start ? now
					  : now + (TimestampTz) EG_BLOCKED_POLL_MS * 1000);
	if (eg_dw.held_n > 0)
		wake_at = Min(wake_at, now + (eg_dw.held_until - GetCurrentTimestamp()));
	if (GetCurrentTimestamp() < eg_db_retry_at)
		wake_at = Max(wake_at, now + (eg_db_retry_at - GetCurrentTimestamp()));
	/*
	 * At most EG_IDLE_POLL_MS, also after a round that had work (which
	 * started no idle time yet): the next round starts the idle time that
	 * eventgrid.worker_idle_timeout, and another database's wait for a
	 * worker slot, count.  (Sleeping 60 s then kept a worker whose last
	 * claim was answered within its round a minute past its idle timeout,
	 * and a database waiting for its turn as long.)
	 */
	timeout_ms = wake_at <= now ? 0
		: (long) Min((wake_at - now + 999) / 1000, (TimestampTz) EG_IDLE_POLL_MS);
	if (timeout_ms <= 0)
		return;
	rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	if (rc & WL_LATCH_SET)
	{
		next_claim_at = 0;
		eg_want_upkeep();
		/* a publish: the extension may just have been created or updated */
		if (eg_store_readiness != EG_READY_OK && eg_error_streak == 0)
			eg_db_retry_at = 0;
	}
}

/* Every waiting request (for put_back_unsent). */
static bool
any_request(const EgRequest *req, void *arg)
{
	return true;
}

/*
 * The requests claimed and not started go back unsent and uncharged (due
 * at once as retries), as for a subscription that changed: a worker about
 * to leave sends nothing more.
 */
static void
put_back_unsent(void)
{
	EgRequest  *req = eg_targets_take(any_request, NULL);

	while (req != NULL)
	{
		EgRequest  *next = req->next;

		/* requests of its keys that waited for it wait in the retries behind it */
		eg_delivery_put_back(req, EG_ACTION_RETRY);
		leave_with_work = true;
		req = next;
		if (req == NULL)
			req = eg_targets_take(any_request, NULL);
	}
}

/*
 * Whether to leave, and leaving: a worker whose database lost the
 * extension (or has another version) leaves at once, its slot saying so;
 * one asked to leave (DDL on its database, or another database's turn) or
 * idle for eventgrid.worker_idle_timeout (at once while another database
 * waits for a worker slot) claims nothing more, puts back what it claimed
 * and did not send, waits for the requests it sent (at most
 * EG_LEAVE_GRACE_MS: those still in flight then are taken back by the next
 * worker, charged as after a crash), records what came of them, and
 * leaves, saying when it is wanted again: at once if it left work, else
 * when its next retry or rate token is due, else when a commit wakes it.
 */
static void
leave_if_due(void)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		busy = eg_http_in_flight() > 0 || eg_targets_queued() > 0 || eg_dw.to_record_n > 0 ||
		last_claim_rows > 0;

	if (eg_store_readiness == EG_READY_MISSING || eg_store_readiness == EG_READY_VERSION)
	{
		if (eg_http_in_flight() == 0)
			eg_worker_leave(DT_NOEND);
		return;
	}
	if (busy)
	{
		idle_since = 0;
		if (now - active_reported >= USECS_PER_SEC)
		{
			eg_worker_busy();
			active_reported = now;
		}
	}
	else if (idle_since == 0)
		idle_since = now;
	if (leaving_since == 0)
	{
		if (!eg_worker_should_leave(idle_since))
			return;
		leaving_since = now;
		leave_with_work = busy || next_claim_at <= eg_now();
		put_back_unsent();
	}
	if (eg_http_in_flight() > 0 && now - leaving_since < (TimestampTz) EG_LEAVE_GRACE_MS * 1000)
		return;
	collect_finished();
	if (eg_delivery_recordable() > 0 && GetCurrentTimestamp() >= eg_db_retry_at)
		(void) eg_delivery_record();
	if (eg_dw.to_record_n > 0 && eg_http_in_flight() == 0 &&
		now - leaving_since < (TimestampTz) (EG_LEAVE_GRACE_MS * 2) * 1000)
		return;					/* a record failed: it tries again first */
	eg_worker_leave(leave_with_work ? 0 : next_claim_at == 0 ? DT_NOEND : next_claim_at);
}

/* Background worker entry point, started by the launcher for the database dboid. */
void
eventgrid_worker_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;

	memcpy(&eg_dw.number, MyBgworkerEntry->bgw_extra, sizeof(eg_dw.number));
	if (eg_dw.number < 1 || eg_dw.number > eg_delivery_workers)
		elog(FATAL, "eventgrid: delivery worker number %d is out of range", eg_dw.number);
	eg_worker_start(arg, "delivery worker", eg_dw.number);
	eg_dw.lease_owner = MyProcPid;
	eg_store_quiet = true;		/* the upkeep worker says what it finds of the extension */
	before_shmem_exit(stop_http, (Datum) 0);
	eg_http_init();

	ereport(DEBUG1, (errmsg("eventgrid: %s started", eg_worker_kind)));

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		eg_recover_from_error(drop_partial);
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		TimestampTz now;
		bool		db_ok;
		bool		claimed;

		if (eg_begin_round())
		{
			eg_http_set_max_connections(eg_max_concurrent_requests);
			eg_http_set_ca_file(eg_ssl_ca_file);
			next_claim_at = 0;
		}

		now = eg_now();
		db_ok = GetCurrentTimestamp() >= eg_db_retry_at;
		if (db_ok && !leases_released)
		{
			leases_released = release_old_leases();
			db_ok = leases_released;
		}
		if (db_ok)
			follow_subscription_changes();
		claimed = claim_round(now, db_ok);
		if (eg_targets_queued() > 0 && GetCurrentTimestamp() >= eg_db_retry_at)
			start_pending();

		/*
		 * Wait for HTTP only when there is no claiming to do meanwhile, and
		 * then for three quarters of what is in flight (at most a few
		 * milliseconds): the freed slots are refilled as one set, with one
		 * durable in-flight record, while the last quarter is still on the
		 * wire and keeps the HTTP thread busy during the WAL flush.  Each
		 * set costs a flush, so sets are made as large as that allows.
		 * Measured against refilling after half: a fifth fewer flushes,
		 * 9-14 % more single-event and fan-out deliveries a second
		 * (bench/RESULTS.md).
		 */
		if (eg_http_in_flight() > 0 && !claimed)
			eg_http_wait(eg_http_in_flight() * 3 / 4, EG_BUSY_POLL_MS);
		collect_finished();
		record_round();
		eg_delivery_report_status(next_claim_at);

		/*
		 * A host a claim left out (backed up) drained in this round, as
		 * requests were started: its subscriptions may claim again, at the
		 * next round.  Read here, before the sleep, not at the top of the
		 * loop: one set of requests can take a host's whole queue and a
		 * fast endpoint answer them before the wait above returns, and the
		 * worker, with nothing queued or in flight, must not then sleep
		 * while those subscriptions' events wait in the database.
		 */
		if (eg_targets_unblocked())
			next_claim_at = 0;
		leave_if_due();
		idle_wait();
	}
}
