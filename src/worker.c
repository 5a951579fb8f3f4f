/*
 * worker.c - the delivery worker's main loop: claim -> deliver -> record
 * (SPEC sections 2, 3, 4 and 7).  The queue's SQL is in queue.c, request
 * building in request.c, the decision after each attempt in retry.c; this
 * file is the loop and its bookkeeping.
 *
 * Claim: due retries and, from each event subscription's position, the
 * next chunk of first attempts, as many as eventgrid.max_bytes_in_flight
 * leaves, turned into requests (one event each, or batches when the
 * subscription batches) from the claim's result; the transaction commits
 * before any network I/O.  Deliver: before requests are handed to libcurl,
 * what they carry is recorded as in flight (durably); libcurl sends many at
 * once on its own thread.  Record: outcomes go back in sets of hundreds, a
 * chunk of first attempts once all of its outcomes are known.
 *
 * Several delivery workers (eventgrid.delivery_workers) share the queue;
 * each owns what it claimed under its pid (lease_owner).  Crashes: a
 * starting worker turns the chunks that workers no longer running left
 * into retries and takes back their leases, charging an attempt (outcome
 * Aborted) only to what was recorded as in flight, what really went to
 * HTTP; the upkeep worker does the same for a worker that exited while the
 * others run on.
 *
 * Upkeep runs in a process of its own, the upkeep worker, which delivery
 * worker 1 starts (and starts again) and which exits with it: about
 * once a second while there is work or an event table holds rows (once a
 * minute otherwise) it counts
 * unmatched events, starts afresh positions restored from another cluster,
 * turns chunks left by another run into retries, and empties event tables
 * that nothing needs any more.  TRUNCATE and its commit take milliseconds
 * that would otherwise stall delivery.
 *
 * Errors: any ERROR in a unit of database work aborts that unit only; what
 * HTTP is doing and the outcomes decided but not yet recorded stay in
 * memory, and the unit is tried again after a pause that grows to 10 s.
 * The error is logged once, not at every try.  SIGINT (pg_cancel_backend)
 * cancels the statement running, nothing more.
 *
 * The worker sets for itself every setting its work depends on (search_path,
 * read-only and isolation defaults, timeouts), so that neither the
 * database's nor the role's defaults can change what its statements mean or
 * make them fail.
 */
#include "eventgrid.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif

#define EG_CLAIM_MAX_ROWS 1000	/* retries per claim */
#define EG_CHUNK_MAX_ROWS 1000	/* first attempts per subscription per claim */
#define EG_UPKEEP_INTERVAL_MS 1000
#define EG_UPKEEP_IDLE_INTERVAL_MS 60000
#define EG_UPKEEP_RESTART_MS 10000
#define EG_RECORD_MIN_ROWS 500
#define EG_RECORD_MAX_DELAY_MS 20
#define EG_IDLE_MAX_SLEEP_MS 60000
#define EG_BUSY_POLL_MS 5
#define EG_WORK_MEM "64MB"		/* the worker's work_mem: see pin_settings() */
#define EG_LEASE_MARGIN_MS 60000
#define EG_ANALYZE_INTERVAL_MS 60000
#define EG_LOCKED_DUE_RETRY_MS 250	/* due rows exist, but another session locks them */
#define EG_PEER_LOCKED_RETRY_MS 10	/* the same with several delivery workers: most likely a peer's claim */
#define EG_NOT_READY_RETRY_MS 10000 /* extension missing, or of another version */
#define EG_ERROR_BACKOFF_MIN_MS 100
#define EG_ERROR_BACKOFF_MAX_MS 10000
#define EG_LOCK_TIMEOUT "10s"

struct EgClaim;

/* Retries handed to HTTP together, recorded as one in-flight record. */
typedef struct EgWave
{
	int64		no;
	int			remaining;		/* its retries not yet recorded */
} EgWave;

/* First attempts claimed together from one position; recorded as a whole. */
typedef struct EgChunk
{
	int64		no;
	int			undecided;		/* deliveries without an outcome yet */
	int			count;
} EgChunk;

/* One claimed delivery and, once decided, its outcome. */
typedef struct EgDelivery
{
	struct EgClaim *claim;
	EgChunk    *chunk;			/* a first attempt's chunk; NULL for a retry */
	EgOutcome	out;			/* out.retry_id or (subscription_id, txid, event_id) name it */
	int32		attempts;		/* attempts made before this claim */
	int32		max_attempts;
	EgProfile	profile;		/* delivery profile of its subscription */
	int64		bytes;			/* event size, counted against max_bytes_in_flight */
	EgWave	   *wave;			/* set once handed to HTTP */
	char	   *prev_outcome;	/* outcome of the previous attempt, if any */
	int32		prev_http_status;
	TimestampTz prev_attempted_at;	/* 0: none */
} EgDelivery;

typedef struct EgClaim
{
	MemoryContext cxt;
	EgDelivery *rows;
	int			unrecorded;
} EgClaim;

static int	lease_owner;		/* this delivery worker's pid */
static int	worker_number;		/* 1 to eventgrid.delivery_workers */
static MemoryContext round_cxt; /* scratch memory of one loop round */

static TimestampTz last_analyze = 0;
static TimestampTz first_unrecorded_at = 0;
static EgDelivery **to_record = NULL;	/* decided, not recorded */
static int	to_record_n = 0;
static int	to_record_cap = 0;
static int	recordable_n = 0;	/* of those, how many may be recorded now */
static int64 next_chunk_no = 1;
static BackgroundWorkerHandle *upkeep_handle = NULL;
static TimestampTz upkeep_start_at = 0;	/* no (re)start of the upkeep worker before this */
static const char *worker_kind = "delivery worker";

static void want_upkeep(void);
static void log_summary(void);

/* upkeep worker: the backlog count and the dead-letter summary */
#define EG_BACKLOG_INTERVAL_MS 5000
#define EG_SUMMARY_INTERVAL_MS 60000
static TimestampTz backlog_at = 0;
static TimestampTz summary_at = 0;
static int64 summary_dead_letter_id = -1;	/* -1: no baseline yet */
static int64 summary_dropped = 0;

/* delivery worker: what pg_stat_activity shows */
#define EG_STATUS_INTERVAL_MS 250
static char status_kind = 0;
static TimestampTz status_at = 0;
static bool status_due = true;	/* a unit of work replaced the text */
static bool was_paused = false;
static int64 bytes_held = 0;	/* event bytes claimed and not yet recorded */
static int64 next_wave_no = 1;
static int64 *waves_done = NULL;	/* recorded waves whose in-flight records can go */
static int	waves_done_n = 0;
static int	waves_done_cap = 0;

/* requests being recorded as in flight; put back in their queues if that fails */
static EgRequest **starting = NULL;
static int	starting_n = 0;

/* a claim being turned into requests (in order); freed if its transaction fails */
static EgClaim *claim_in_progress = NULL;
static EgRequest *built_head = NULL;
static EgRequest *built_tail = NULL;

/*
 * Delivery attempts made and not yet written to the attempt history, in
 * their own memory (reset once written); written with the next outcomes.
 */
static MemoryContext history_cxt = NULL;
static EgAttempt *history = NULL;
static int	history_n = 0;
static int	history_cap = 0;

/* error recovery */
static char *last_error = NULL;
static int	error_streak = 0;
static long error_backoff_ms = 0;
static TimestampTz db_retry_at = 0; /* no database work before this */

/*
 * Opens a unit of database work; false (nothing open) when the extension is
 * missing or of another version, and then no database work for a while.
 */
static bool
begin_work(const char *activity)
{
	if (eg_queue_begin(activity))
		return true;
	MemoryContextSwitchTo(round_cxt);
	db_retry_at = GetCurrentTimestamp() + (TimestampTz) EG_NOT_READY_RETRY_MS * 1000;
	return false;
}

/* Commits a unit of work; a run of failed tries before it is over. */
static void
end_work(void)
{
	eg_queue_commit();
	MemoryContextSwitchTo(round_cxt);
	if (error_streak > 0)
		ereport(LOG,
				(errmsg("eventgrid: the delivery worker's database work succeeds again after %d failed tries",
						error_streak)));
	error_streak = 0;
	error_backoff_ms = 0;
	if (last_error)
		pfree(last_error);
	last_error = NULL;
	status_due = true;
}

/*
 * Shows in pg_stat_activity what the delivery worker does: waiting for the
 * extension, retrying failed database work, paused, delivering (requests in
 * flight and waiting, outcomes to record, the backlog the upkeep worker last
 * counted) or idle (and when the next retry is due).  The text is replaced
 * when its kind changes or a unit of work replaced it, else at most every
 * EG_STATUS_INTERVAL_MS.  Logs pausing and resuming once each.
 */
static void
report_status(TimestampTz next_claim_at)
{
	char		text[256];
	char		kind;
	int			in_flight = eg_http_in_flight();
	int			waiting = eg_targets_queued();
	TimestampTz now = GetCurrentTimestamp();

	if (eg_delivery_paused != was_paused)
	{
		was_paused = eg_delivery_paused;
		if (was_paused)
			ereport(LOG,
					(errmsg("eventgrid: delivery paused (eventgrid.delivery_paused = on); %d requests in flight will finish, nothing new is claimed",
							in_flight)));
		else
			ereport(LOG, (errmsg("eventgrid: delivery resumed (eventgrid.delivery_paused = off)")));
	}

	kind = eg_queue_readiness == EG_READY_MISSING ? 'm'
		: eg_queue_readiness == EG_READY_VERSION ? 'v'
		: error_streak > 0 ? 'e'
		: eg_delivery_paused ? 'p'
		: (in_flight > 0 || waiting > 0 || to_record_n > 0) ? 'd'
		: 'i';
	if (kind == status_kind && !status_due && now - status_at < (TimestampTz) EG_STATUS_INTERVAL_MS * 1000)
		return;

	switch (kind)
	{
		case 'm':
			snprintf(text, sizeof(text), "eventgrid: waiting for CREATE EXTENSION eventgrid in this database");
			break;
		case 'v':
			snprintf(text, sizeof(text), "eventgrid: waiting for ALTER EXTENSION eventgrid UPDATE TO '%s'", EG_VERSION);
			break;
		case 'e':
			snprintf(text, sizeof(text), "eventgrid: database work failed %d times in a row (see the server log); trying again",
					 error_streak);
			break;
		case 'p':
			snprintf(text, sizeof(text), "eventgrid: paused (eventgrid.delivery_paused); %d requests in flight", in_flight);
			break;
		case 'd':
			{
				int64		backlog;

				SpinLockAcquire(&eg_shared->mutex);
				backlog = eg_shared->backlog;
				SpinLockRelease(&eg_shared->mutex);
				snprintf(text, sizeof(text),
						 "eventgrid: delivering: %d requests in flight, %d waiting to be sent, %d outcomes to record; backlog of %s %lld deliveries",
						 in_flight, waiting, to_record_n, backlog >= EG_BACKLOG_COUNT_LIMIT ? "at least" : "about",
						 (long long) Min(backlog, EG_BACKLOG_COUNT_LIMIT));
				break;
			}
		default:
			if (next_claim_at > 0 && next_claim_at < DT_NOEND)
				snprintf(text, sizeof(text), "eventgrid: idle; next retry due at %s",
						 timestamptz_to_str(next_claim_at));
			else
				snprintf(text, sizeof(text), "eventgrid: idle");
			break;
	}
	status_kind = kind;
	status_due = false;
	status_at = now;
	pgstat_report_activity(kind == 'd' ? STATE_RUNNING : STATE_IDLE, text);
}

/*
 * Queues a decided delivery for recording.  A retry may be recorded at
 * once; a first attempt once every delivery of its chunk is decided.
 */
static void
push_record(EgDelivery *d)
{
	int			ready = d->chunk == NULL ? 1 : (--d->chunk->undecided == 0 ? d->chunk->count : 0);

	if (recordable_n == 0 && ready > 0)
		first_unrecorded_at = GetCurrentTimestamp();
	recordable_n += ready;
	if (to_record_n == to_record_cap)
	{
		to_record_cap = Max(64, to_record_cap * 2);
		to_record = to_record == NULL
			? MemoryContextAlloc(TopMemoryContext, to_record_cap * sizeof(EgDelivery *))
			: repalloc(to_record, to_record_cap * sizeof(EgDelivery *));
	}
	to_record[to_record_n++] = d;
}

static double
random_fraction(void)
{
#if PG_VERSION_NUM >= 150000
	return pg_prng_double(&pg_global_prng_state);
#else
	return (double) random() / ((double) MAX_RANDOM_VALUE + 1);
#endif
}

/*
 * Applies eg_decide() to a delivery after an attempt that started at
 * started, or (transport EG_TRANSPORT_HELD) one its endpoint's probation
 * held back: that counts as an attempt with outcome Probation, but no
 * request was sent.
 */
static void
decide(EgDelivery *d, EgTransport transport, int http_status, TimestampTz started, TimestampTz now)
{
	EgDecision	dec = eg_decide(d->profile, d->attempts, d->max_attempts, transport, http_status,
								eg_retry_jitter_percent, random_fraction());

	d->out.action = dec.action;
	d->out.outcome = dec.outcome;
	d->out.http_status = dec.http_status;
	d->out.attempted = transport != EG_TRANSPORT_HELD;
	d->out.attempts_after = dec.attempts_after;
	d->out.attempted_at = started;
	d->out.reason = dec.reason;
	if (dec.action == 'r')
		d->out.next_at = now + dec.delay_ms * 1000;
	push_record(d);
}

/*
 * Ends a delivery without an attempt now: TTL ran out, attempts used up,
 * unmatched (or its event gone), or (reason NonRetriableError with outcome
 * InvalidHeader) a request that may not be sent.  Recorded once the claim
 * commits.
 */
static void
finish_without_attempt(EgDelivery *d, char action, const char *reason, const char *outcome)
{
	d->out.action = action;
	d->out.reason = reason;
	d->out.attempted = false;
	d->out.outcome = outcome ? outcome : d->prev_outcome;
	d->out.http_status = outcome ? 0 : d->prev_http_status;
	d->out.attempted_at = outcome ? eg_now() : d->prev_attempted_at;
	d->out.attempts_after = d->attempts;
}

/*
 * A copy of a transport error text fit for the history: bytes outside
 * printable ASCII (which an endpoint's answer could put into libcurl's
 * message) become '?'.
 */
static char *
printable_copy(const char *text)
{
	char	   *copy = MemoryContextStrdup(history_cxt, text);

	for (char *c = copy; *c; c++)
		if ((unsigned char) *c < 0x20 || (unsigned char) *c > 0x7e)
			*c = '?';
	return copy;
}

/*
 * Keeps the attempt a request made (or, transport EG_TRANSPORT_HELD, that
 * its endpoint's probation held back) for the attempt history, as
 * eventgrid.attempt_history says.  Called before its deliveries are decided.
 */
static void
remember_attempt(EgRequest *req, TimestampTz started)
{
	EgAttempt  *a;
	int64	   *ids;
	bool		delivered = req->transport == EG_TRANSPORT_OK && eg_status_is_success(req->http_status);

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
	for (int k = 0; k < req->count; k++)
		ids[k] = ((EgDelivery *) req->items[k])->out.event_id;
	a->attempted_at = started;
	a->subscription_id = req->subscription_id;
	a->subscription_name = MemoryContextStrdup(history_cxt, req->subscription_name);
	a->topic = MemoryContextStrdup(history_cxt, req->topic);
	a->event_ids = ids;
	a->nevents = req->count;
	a->attempt = ((EgDelivery *) req->items[0])->attempts + 1;
	a->http_status = req->transport == EG_TRANSPORT_OK ? req->http_status : 0;
	a->outcome = eg_outcome_name(req->transport, a->http_status);
	if (req->transport == EG_TRANSPORT_HELD)
	{
		a->duration_ms = -1;
		a->error = "not sent: the endpoint is on probation (delayed delivery)";
	}
	else
	{
		a->duration_ms = req->duration_ms;
		a->error = req->transport == EG_TRANSPORT_OK ? NULL
			: printable_copy(req->errbuf[0] ? req->errbuf : a->outcome);
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

/* Frees requests that were built but will never be started. */
static void
free_built_requests(void)
{
	while (built_head)
	{
		EgRequest  *next = built_head->next;

		eg_http_free_headers(built_head);
		free(built_head->body);
		built_head->body = NULL;
		built_head = next;
	}
	built_tail = NULL;
}

/*
 * The claimed rows [from, to) of one subscription become requests: rows
 * that cannot be attempted are finished at once; the others go in batches
 * (or one by one) built from the claim's texts, which are not copied again.
 */
static void
build_requests(EgClaim *claim, EgClaimedRow *rows, int from, int to, StringInfo scratch)
{
	EgDelivery **send = palloc(sizeof(EgDelivery *) * (to - from));
	EgEventPart *parts = palloc(sizeof(EgEventPart) * (to - from));
	int		   *rowno = palloc(sizeof(int) * (to - from));
	int			nsend = 0;
	int			max_events = 1;
	int64		max_bytes = 0;
	EgTarget   *target = NULL;

	for (int k = from; k < to; k++)
	{
		EgDelivery *d = &claim->rows[k];

		if (d->out.subscription_id == 0)
			finish_without_attempt(d, 'u', NULL, NULL); /* a retry whose subscription is gone */
		else if (rows[k].expired)
			finish_without_attempt(d, 'f', "TimeToLiveExceeded", NULL);
		else if (d->attempts >= d->max_attempts)
			finish_without_attempt(d, 'f', "MaxDeliveryAttemptsExceeded", NULL);
		else
		{
			parts[nsend] = rows[k].payload;
			rowno[nsend] = k;
			send[nsend++] = d;
		}
	}
	if (rows[from].max_events_per_batch > 0 || rows[from].preferred_batch_kb > 0)
	{
		max_events = rows[from].max_events_per_batch > 0
			? rows[from].max_events_per_batch : eg_default_max_events_per_batch;
		max_bytes = (int64) 1024 * (rows[from].preferred_batch_kb > 0
									? rows[from].preferred_batch_kb : eg_default_preferred_batch_kb);
	}
	for (int k = 0; k < nsend;)
	{
		int			take = eg_batch_take(&parts[k], nsend - k, max_events, max_bytes);
		EgClaimedRow *first = &rows[rowno[k]];
		EgRequest  *req = MemoryContextAllocZero(claim->cxt, sizeof(EgRequest));
		EgRequestSpec spec;

		spec.schema = first->schema;
		spec.subscription_name = first->subscription_name;
		spec.delivery_count = first->attempts;
		spec.output_event_id = first->output_event_id;
		spec.data_version = first->data_version;
		spec.metadata_version = first->metadata_version;
		spec.custom_headers = first->custom_headers;
		if (eg_request_build(req, &spec, &parts[k], take, scratch))
		{
			if (target == NULL)
				target = eg_target(first->endpoint);	/* one subscription: one endpoint */
			req->target = target;
			req->url = eg_target_url(target);
			req->subscription_id = first->subscription_id;
			req->subscription_name = MemoryContextStrdup(claim->cxt, first->subscription_name);
			req->topic = MemoryContextStrdup(claim->cxt, first->topic);
			req->items = MemoryContextAlloc(claim->cxt, sizeof(void *) * take);
			memcpy(req->items, &send[k], sizeof(void *) * take);
			req->count = take;
			req->bytes = 0;
			for (int j = k; j < k + take; j++)
				req->bytes += send[j]->bytes;
			req->next = NULL;
			if (built_tail)
				built_tail->next = req;
			else
				built_head = req;
			built_tail = req;
		}
		else
		{
			/* second line of defence: a header line an event would corrupt */
			for (int j = k; j < k + take; j++)
				finish_without_attempt(send[j], 'f', "NonRetriableError", "InvalidHeader");
			ereport(LOG,
					(errmsg("eventgrid: a delivery request of event subscription \"%s\" was not sent: a header value holds a control character",
							first->subscription_name),
					 errdetail("%d events were dead-lettered or dropped with outcome InvalidHeader.", take)));
		}
		k += take;
	}
	pfree(send);
	pfree(parts);
	pfree(rowno);
}

/*
 * Claims due retries and first attempts, within byte_budget event bytes,
 * and turns them into queued requests.  Returns the number claimed, or -1
 * when the extension is not ready; *more says that more is ready at once,
 * *locked that another session holds what would be claimed.
 */
static int
claim(int64 byte_budget, bool *more, bool *locked)
{
	EgClaim    *claim;
	EgClaimedRow *rrows;
	EgClaimedRow *frows;
	EgClaimedRow *rows;
	int			nr;
	int			nf;
	int			n;
	int64		retry_bytes = 0;
	StringInfoData scratch;
	int64	   *skip;
	int			nskip = eg_targets_skip_list(&skip);

	*more = false;
	*locked = false;
	if (!begin_work("eventgrid: claiming deliveries"))
		return -1;

	/*
	 * A claim lost in a crash only means claiming again (nothing of it was
	 * sent before a later, durable in-flight record): no need to wait for
	 * the flush.
	 */
	eg_queue_no_flush_wait();
	nr = eg_queue_claim_retries(eg_now(), EG_CLAIM_MAX_ROWS, byte_budget, lease_owner,
								(int64) eg_response_timeout_ms + EG_LEASE_MARGIN_MS, &rrows);
	for (int i = 0; i < nr; i++)
		retry_bytes += rrows[i].bytes;
	/* chunk numbers of a claim that fails are not used again: no harm */
	nf = eg_queue_claim_first(eg_now(), EG_CHUNK_MAX_ROWS, Max(byte_budget - retry_bytes, 1),
							  lease_owner, skip, nskip, &next_chunk_no, &frows, more, locked);
	if (nr == EG_CLAIM_MAX_ROWS)
		*more = true;

	/*
	 * In-flight records of recorded waves go in the same transaction: a
	 * retry claimed again must not be named by an old one once this
	 * commits.
	 */
	eg_queue_forget_waves(lease_owner, waves_done, waves_done_n);
	n = nr + nf;
	if (n == 0)
	{
		end_work();
		waves_done_n = 0;
		return 0;
	}
	rows = palloc(n * sizeof(EgClaimedRow));
	memcpy(rows, rrows, nr * sizeof(EgClaimedRow));
	memcpy(rows + nr, frows, nf * sizeof(EgClaimedRow));

	claim = MemoryContextAllocZero(TopMemoryContext, sizeof(EgClaim));
	claim->cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid claim", ALLOCSET_DEFAULT_SIZES);
	claim->rows = MemoryContextAllocZero(claim->cxt, n * sizeof(EgDelivery));
	claim->unrecorded = n;
	claim_in_progress = claim;
	for (int i = 0; i < n; i++)
	{
		EgDelivery *d = &claim->rows[i];

		d->claim = claim;
		if (rows[i].chunk != 0)
		{
			if (i == 0 || rows[i - 1].chunk != rows[i].chunk)
			{
				d->chunk = MemoryContextAllocZero(claim->cxt, sizeof(EgChunk));
				d->chunk->no = rows[i].chunk;
			}
			else
				d->chunk = claim->rows[i - 1].chunk;
			d->chunk->undecided++;
			d->chunk->count++;
		}
		d->out.retry_id = rows[i].retry_id;
		d->out.subscription_id = rows[i].subscription_id;
		d->out.txid = rows[i].txid;
		d->out.event_id = rows[i].event_id;
		d->attempts = rows[i].attempts;
		d->max_attempts = rows[i].max_attempts;
		d->profile = rows[i].profile;
		d->bytes = rows[i].bytes;
		d->prev_outcome = rows[i].prev_outcome ? MemoryContextStrdup(claim->cxt, rows[i].prev_outcome) : NULL;
		d->prev_http_status = rows[i].prev_http_status;
		d->prev_attempted_at = rows[i].prev_attempted_at;
	}

	/* rows of one subscription (retries) or one chunk (first attempts) become requests */
	initStringInfo(&scratch);
	for (int i = 0; i < n;)
	{
		int			j = i;

		while (j < n && rows[j].subscription_id == rows[i].subscription_id &&
			   rows[j].chunk == rows[i].chunk)
			j++;
		build_requests(claim, rows, i, j, &scratch);
		i = j;
	}
	pfree(scratch.data);
	end_work();
	waves_done_n = 0;
	want_upkeep();

	/* committed: the requests may go, and rows finished without an attempt are recorded */
	while (built_head)
	{
		EgRequest  *req = built_head;

		built_head = req->next;
		eg_target_queue(req);
	}
	built_tail = NULL;
	for (int i = 0; i < n; i++)
	{
		bytes_held += claim->rows[i].bytes;
		if (claim->rows[i].out.action != 0)
			push_record(&claim->rows[i]);
	}
	claim_in_progress = NULL;

	/* a full claim of retries means a backlog: fresh statistics, at most once a minute */
	if (nr == EG_CLAIM_MAX_ROWS && GetCurrentTimestamp() - last_analyze >= EG_ANALYZE_INTERVAL_MS * 1000)
	{
		last_analyze = GetCurrentTimestamp();
		if (begin_work("eventgrid: analyzing eventgrid.retries"))
		{
			eg_queue_analyze();
			end_work();
		}
	}
	return n;
}

static void
release_claim_row(EgDelivery *d)
{
	EgClaim    *claim = d->claim;

	bytes_held -= d->bytes;
	if (d->wave && --d->wave->remaining == 0)
	{
		if (waves_done_n == waves_done_cap)
		{
			waves_done_cap = Max(16, waves_done_cap * 2);
			waves_done = waves_done == NULL
				? MemoryContextAlloc(TopMemoryContext, waves_done_cap * sizeof(int64))
				: repalloc(waves_done, waves_done_cap * sizeof(int64));
		}
		waves_done[waves_done_n++] = d->wave->no;
		pfree(d->wave);
	}
	d->wave = NULL;
	if (--claim->unrecorded == 0)
	{
		MemoryContextDelete(claim->cxt);
		pfree(claim);
	}
}

/*
 * Writes back, in one transaction, every decided retry, every chunk of
 * first attempts whose deliveries are all decided, and the health of the
 * endpoints whose health changed.  Returns the earliest
 * retry time recorded, or DT_NOEND.  On an ERROR nothing is lost: the
 * deliveries stay decided in memory and the next call writes them.
 */
static TimestampTz
record(void)
{
	int			nwaves = waves_done_n;
	int			n = 0;
	int			nchunks = 0;
	int			keep = 0;
	TimestampTz earliest = DT_NOEND;
	EgOutcome **outcomes = palloc(Max(to_record_n, 1) * sizeof(EgOutcome *));
	EgDelivery **done = palloc(Max(to_record_n, 1) * sizeof(EgDelivery *));
	int64	   *chunks = palloc(Max(to_record_n, 1) * sizeof(int64));
	EgHealth   *health;
	int			nhealth = eg_targets_dirty(&health);

	for (int i = 0; i < to_record_n; i++)
	{
		EgDelivery *d = to_record[i];

		if (d->chunk != NULL && d->chunk->undecided > 0)
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

	if (!begin_work("eventgrid: recording delivery outcomes"))
	{
		/* extension dropped: nothing to record into */
		if (eg_queue_readiness == EG_READY_MISSING)
		{
			forget_attempts();
			goto release;
		}
		return DT_NOEND;
	}

	/*
	 * Outcomes need not wait for the WAL flush: one lost in a crash leaves
	 * its chunk in flight (or its retry leased and in an in-flight record),
	 * so after restart it is charged as Aborted and retried, which
	 * at-least-once delivery allows.
	 */
	eg_queue_no_flush_wait();
	earliest = eg_queue_record(outcomes, n, lease_owner, chunks, nchunks, history, history_n);
	eg_queue_forget_waves(lease_owner, waves_done, nwaves);
	eg_queue_save_health(health, nhealth, eg_now());
	end_work();
	eg_targets_written(health, nhealth);
	forget_attempts();

	/* waves recorded before this call are forgotten now */
	memmove(waves_done, waves_done + nwaves, (waves_done_n - nwaves) * sizeof(int64));
	waves_done_n -= nwaves;
release:
	/* keep what could not be recorded yet, in order */
	for (int i = 0; i < to_record_n; i++)
	{
		EgDelivery *d = to_record[i];

		if (d->chunk != NULL && d->chunk->undecided > 0)
			to_record[keep++] = d;
	}
	to_record_n = keep;
	recordable_n = 0;
	for (int i = 0; i < n; i++)
		release_claim_row(done[i]);
	return earliest;
}

/* Earliest due time of retries this worker does not hold, or DT_NOEND. */
static TimestampTz
next_due(void)
{
	TimestampTz result;

	if (!begin_work("eventgrid: looking up the next due delivery"))
		return DT_NOEND;
	result = eg_queue_next_due();
	end_work();
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

	if (!begin_work("eventgrid: releasing leases of an interrupted run"))
		return false;
	eg_queue_recover(lease_owner, eg_now(), eg_attempt_history != EG_HISTORY_OFF, &charged, &released);
	nhealth = eg_queue_load_health(&health);
	eg_targets_load(health, nhealth);
	if (released > 0)
		ereport(LOG,
				(errmsg("eventgrid: %llu deliveries in flight when the worker stopped will be retried",
						(unsigned long long) released),
				 errdetail("%llu of them had been sent and are counted as attempts with outcome Aborted.",
						   (unsigned long long) charged)));
	end_work();
	return true;
}

/*
 * Records the deliveries of a request its endpoint's probation holds back
 * (an attempt with outcome Probation, due again on the schedule but not
 * before the probation ends), and frees it.
 */
static void
hold_request(EgRequest *req, TimestampTz now)
{
	TimestampTz until = eg_target_probation_until(req->target);

	req->transport = EG_TRANSPORT_HELD;
	req->http_status = 0;
	remember_attempt(req, now);
	for (int k = 0; k < req->count; k++)
	{
		EgDelivery *d = (EgDelivery *) req->items[k];

		decide(d, EG_TRANSPORT_HELD, 0, now, now);
		/* not due again before the probation ends: that would only be held again */
		if (d->out.action == 'r' && d->out.next_at < until)
			d->out.next_at = until;
	}
	eg_http_free_headers(req);
	free(req->body);
	req->body = NULL;
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
 * attempts as the last event of each chunk sent so far (a chunk's requests
 * go in order: one subscription, one host queue).  After a crash exactly
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
	bool		hold;
	int			nstart;

	starting = palloc(Max(room, 1) * sizeof(EgRequest *));
	starting_n = 0;
	while ((req = eg_target_next(now, starting_n < room, &hold)) != NULL)
	{
		if (hold)
			hold_request(req, now);
		else
		{
			starting[starting_n++] = req;
			nrows += req->count;
		}
	}
	if (starting_n == 0)
		return;

	if (!begin_work("eventgrid: recording requests in flight"))
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
				marks[nmarks++].chunk = d->chunk->no;
			marks[m].txid = d->out.txid;
			marks[m].event_id = d->out.event_id;
		}
	}
	eg_queue_mark_in_flight(lease_owner, next_wave_no, ids, nretries, marks, nmarks);
	eg_queue_forget_waves(lease_owner, waves_done, waves_done_n);
	end_work();
	waves_done_n = 0;
	nstart = starting_n;
	starting_n = 0;				/* committed: nothing to put back from here on */

	if (nretries > 0)
	{
		wave = MemoryContextAlloc(TopMemoryContext, sizeof(EgWave));
		wave->no = next_wave_no++;
		wave->remaining = nretries;
	}
	for (int i = 0; i < nstart; i++)
	{
		req = starting[i];
		for (int k = 0; k < req->count; k++)
			if (((EgDelivery *) req->items[k])->chunk == NULL)
				((EgDelivery *) req->items[k])->wave = wave;
		req->started_at = eg_now();
	}
	eg_http_start(starting, nstart, eg_response_timeout_ms);
}

/*
 * Upkeep of the queue: positions restored from another cluster start
 * afresh, chunks and in-flight retries of delivery workers that no longer
 * run become retries (eg_queue_recover), published and unmatched events
 * are counted, each event table other than the current one is emptied if
 * nothing needs it, and the attempt history is rotated when its current
 * table is due.  Each step is its own unit of work.  Runs in the upkeep worker.  Returns whether an event
 * table holds rows still (upkeep is then wanted again soon).
 */
static bool
upkeep(void)
{
	bool		used = false;

	TimestampTz now = eg_now();
	uint64		charged;
	uint64		taken;
	uint64		rebased = 0;
	int			current = eg_event_table_at(GetCurrentTimestamp());

	if (!begin_work("eventgrid: counting published and unmatched events"))
		return false;
	/* not while paused: a pg_restore may still be writing positions and events */
	if (!eg_delivery_paused)
		rebased = eg_queue_rebase(now);
	eg_queue_recover(0, now, eg_attempt_history != EG_HISTORY_OFF, &charged, &taken);
	if (taken > 0)
		ereport(LOG,
				(errmsg("eventgrid: %llu deliveries left in flight by a delivery worker that no longer exists will be retried",
						(unsigned long long) taken),
				 errdetail("%llu of them had been sent and are counted as attempts with outcome Aborted.",
						   (unsigned long long) charged)));
	eg_queue_count_unmatched();
	eg_queue_forget_health();
	end_work();
	/* retries made here are due at once: the delivery worker may be asleep until its next due time */
	if (rebased > 0 || taken > 0)
		eg_wake_worker();

	for (int k = 0; k < EG_EVENT_TABLES; k++)
	{
		if (!begin_work("eventgrid: emptying an event table"))
			return used;
		if (k == current)
			used |= eg_queue_table_used(k);
		else
			used |= eg_queue_truncate(k, now) != NULL;
		end_work();
	}

	if (!begin_work("eventgrid: rotating the attempt history"))
		return used;
	(void) eg_queue_rotate_history(eg_now(), (int64) eg_attempt_history_retention_s * 500,
								   Max(eg_attempt_history_max_rows / 2, 1));
	end_work();

	if (GetCurrentTimestamp() - backlog_at >= (TimestampTz) EG_BACKLOG_INTERVAL_MS * 1000)
	{
		int64		backlog;

		if (!begin_work("eventgrid: counting the backlog"))
			return used;
		backlog = eg_queue_backlog(now);
		end_work();
		backlog_at = GetCurrentTimestamp();
		SpinLockAcquire(&eg_shared->mutex);
		eg_shared->backlog = backlog;
		SpinLockRelease(&eg_shared->mutex);
	}
	if (GetCurrentTimestamp() - summary_at >= (TimestampTz) EG_SUMMARY_INTERVAL_MS * 1000)
	{
		if (!begin_work("eventgrid: summing up dead-lettered and dropped events"))
			return used;
		log_summary();
		end_work();
		summary_at = GetCurrentTimestamp();
	}
	return used;
}

/*
 * Logs, at most once a minute and only when there were any, how many events
 * were dead-lettered (by reason) and dropped since the last summary; the
 * first call only takes the baseline.  Never a line per event.
 */
static void
log_summary(void)
{
	EgFinals	f = eg_queue_finals(summary_dead_letter_id < 0 ? PG_INT64_MAX : summary_dead_letter_id);
	int64		dropped = summary_dead_letter_id < 0 ? 0 : Max(f.dropped - summary_dropped, 0);

	if (f.dead_lettered > 0 || dropped > 0)
		ereport(LOG,
				(errmsg("eventgrid: since the last summary %lld events were dead-lettered and %lld dropped",
						(long long) f.dead_lettered, (long long) dropped),
				 f.by_reason ? errdetail("Dead-lettered by reason: %s.", f.by_reason) : 0,
				 errhint("eventgrid.dead_letter_events lists the dead letters; eventgrid.delivery_statistics counts both per event subscription.")));
	summary_dead_letter_id = Max(f.last_dead_letter_id, summary_dead_letter_id < 0 ? 0 : summary_dead_letter_id);
	summary_dropped = f.dropped;
}

/* Tells the upkeep worker that work came in: upkeep within a second. */
static void
want_upkeep(void)
{
	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->upkeep_wanted = true;
	SpinLockRelease(&eg_shared->mutex);
}

/*
 * Starts the upkeep worker for database dboid when it is not running (again
 * at most every 10 s).  It is not waited for: a delivery worker keeps
 * delivering without it.
 */
static void
ensure_upkeep_worker(Oid dboid)
{
	BackgroundWorker worker;
	pid_t		pid;
	MemoryContext oldcxt;
	bool		started;

	if (upkeep_handle != NULL)
	{
		if (GetBackgroundWorkerPid(upkeep_handle, &pid) != BGWH_STOPPED)
			return;
		pfree(upkeep_handle);
		upkeep_handle = NULL;
		upkeep_start_at = GetCurrentTimestamp() + (TimestampTz) EG_UPKEEP_RESTART_MS * 1000;
	}
	if (GetCurrentTimestamp() < upkeep_start_at)
		return;
	upkeep_start_at = GetCurrentTimestamp() + (TimestampTz) EG_UPKEEP_RESTART_MS * 1000;
	eg_worker_spec(&worker, "eventgrid_upkeep_main", "upkeep worker", dboid, 0);
	/* the handle outlives this loop round */
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	started = RegisterDynamicBackgroundWorker(&worker, &upkeep_handle);
	MemoryContextSwitchTo(oldcxt);
	if (!started)
	{
		upkeep_handle = NULL;
		ereport(LOG,
				(errmsg("eventgrid: could not start the upkeep worker; trying again in %d s",
						EG_UPKEEP_RESTART_MS / 1000),
				 errhint("Raise max_worker_processes: eventgrid needs eventgrid.delivery_workers + 2 background workers.")));
	}
}

static void
collect_finished(void)
{
	EgRequest  *req;
	TimestampTz now = eg_now();

	while ((req = eg_http_take_finished()) != NULL)
	{
		if (req->transport != EG_TRANSPORT_OK)
			ereport(DEBUG1,
					(errmsg("eventgrid: delivery request to \"%s\" failed: %s", req->url,
							req->errbuf[0] ? req->errbuf : eg_outcome_name(req->transport, 0))));
		eg_target_finished(req, now);
		remember_attempt(req, req->started_at);
		for (int k = 0; k < req->count; k++)
			decide((EgDelivery *) req->items[k], req->transport, req->http_status,
				   req->started_at, now);
	}
}

static void
detach_latch(int code, Datum arg)
{
	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->worker_latch[worker_number - 1] = NULL;
	eg_shared->worker_pid[worker_number - 1] = 0;
	SpinLockRelease(&eg_shared->mutex);
	eg_http_shutdown();
}

/*
 * Settings the worker's statements depend on, set here so that database
 * and role defaults (ALTER DATABASE ... SET, ALTER ROLE ... SET) cannot
 * change them: a search_path with only pg_catalog and pg_temp (last), so no
 * function or operator anyone created can run in place of the built-in one;
 * writable READ COMMITTED transactions; no statement or idle timeout; a
 * lock timeout of its own, so a lock held elsewhere delays the worker's
 * work without stopping HTTP.
 *
 * Plans: queue tables swing between empty and large.  After a VACUUM finds
 * one empty, the planner takes it for empty until the next ANALYZE and the
 * cached plans scan every page of it on each statement (measured: drain
 * rate 18,000 -> 2,800 events/s after a steady run), or bitmap-scan and
 * sort every due row to take the first thousand, so that each claim costs
 * the whole backlog.  Every statement of this worker has a plain index
 * path, so sequential and bitmap scans are ruled out here.
 *
 * Memory: the due-retry claim sorts its rows (up to 1,000) with their JSON
 * text; at the default work_mem of 4 MB a thousand 1-KB events already
 * spill to disk, and EG_WORK_MEM keeps such a claim in memory.  A
 * first-attempt claim sorts nothing wide in SQL: its rows are put in order
 * in C.
 */
static void
pin_settings(void)
{
	static const char *const settings[][2] = {
		{"search_path", "pg_catalog, pg_temp"},
		{"default_transaction_read_only", "off"},
		{"default_transaction_isolation", "read committed"},
		{"default_transaction_deferrable", "off"},
		{"session_replication_role", "origin"},
		{"statement_timeout", "0"},
		{"idle_in_transaction_session_timeout", "0"},
		{"lock_timeout", EG_LOCK_TIMEOUT},
		{"synchronous_commit", "on"},
		{"jit", "off"},
		{"work_mem", EG_WORK_MEM},
		{"enable_seqscan", "off"},
		{"enable_bitmapscan", "off"},
	};

	for (int i = 0; i < (int) lengthof(settings); i++)
		SetConfigOption(settings[i][0], settings[i][1], PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * Error recovery, entered through longjmp from any ERROR in the loop: the
 * failed unit of work is rolled back and the loop goes on.  Requests in
 * HTTP and outcomes decided but not recorded are untouched; a claim that
 * was being turned into requests is dropped (its leases rolled back with
 * it).  The error is logged the first time; the same error again is not.
 */
static void
recover_from_error(void)
{
	ErrorData  *edata;
	bool		repeated;

	error_context_stack = NULL;
	HOLD_INTERRUPTS();
	disable_all_timeouts(false);
	QueryCancelPending = false;

	MemoryContextSwitchTo(TopMemoryContext);
	edata = CopyErrorData();
	repeated = last_error != NULL && edata->message != NULL && strcmp(last_error, edata->message) == 0;
	if (!repeated)
	{
		EmitErrorReport();
		if (last_error)
			pfree(last_error);
		last_error = pstrdup(edata->message ? edata->message : "");
	}
	FreeErrorData(edata);
	FlushErrorState();

	AbortCurrentTransaction();
	unsend_starting();
	if (claim_in_progress)
	{
		free_built_requests();
		MemoryContextDelete(claim_in_progress->cxt);
		pfree(claim_in_progress);
		claim_in_progress = NULL;
	}
	pgstat_report_activity(STATE_IDLE, NULL);

	error_streak++;
	error_backoff_ms = Min(Max(error_backoff_ms * 2, EG_ERROR_BACKOFF_MIN_MS), EG_ERROR_BACKOFF_MAX_MS);
	db_retry_at = GetCurrentTimestamp() + (TimestampTz) error_backoff_ms * 1000;
	if (!repeated)
		ereport(LOG,
				(errmsg("eventgrid: the %s will try that again in %ld ms; requests in flight and recorded outcomes are kept",
						worker_kind, error_backoff_ms)));
	MemoryContextSwitchTo(round_cxt);
	RESUME_INTERRUPTS();
}

/*
 * What both workers do first: signal handlers (SIGINT cancels only the
 * statement running), a connection to database dboid, the pinned settings,
 * the name shown in pg_stat_activity.
 */
static void
worker_start(Datum dboid, const char *kind, int number)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, StatementCancelHandler);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(dboid), InvalidOid, 0);
	worker_kind = number > 0 && eg_delivery_workers > 1 ? psprintf("%s %d", kind, number) : kind;
	pgstat_report_appname(psprintf("eventgrid %s", worker_kind));
	pin_settings();
	round_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid round", ALLOCSET_DEFAULT_SIZES);
}

/*
 * What both workers do at the top of each loop round: fresh scratch memory,
 * interrupts, exit with the postmaster, configuration reload.  Returns
 * whether the configuration was reloaded.
 */
static bool
begin_round(void)
{
	MemoryContextSwitchTo(round_cxt);
	MemoryContextReset(round_cxt);
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		proc_exit(1);
	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);	/* pinned settings outrank the file */
	return true;
}

/* Background worker entry point, started by the launcher for the database dboid. */
void
eventgrid_worker_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	volatile TimestampTz next_claim_at = 0;
	volatile bool leases_released = false;

	memcpy(&worker_number, MyBgworkerEntry->bgw_extra, sizeof(worker_number));
	if (worker_number < 1 || worker_number > eg_delivery_workers)
		elog(FATAL, "eventgrid: delivery worker number %d is out of range", worker_number);
	worker_start(arg, "delivery worker", worker_number);
	lease_owner = MyProcPid;

	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->worker_latch[worker_number - 1] = MyLatch;
	eg_shared->worker_pid[worker_number - 1] = MyProcPid;
	SpinLockRelease(&eg_shared->mutex);
	eg_http_init();
	before_shmem_exit(detach_latch, (Datum) 0);

	ereport(LOG, (errmsg("eventgrid %s started in database \"%s\"", worker_kind, eg_database_name)));

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		recover_from_error();
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		TimestampTz now;
		bool		db_ok;
		bool		want_claim;
		int64		byte_limit = (int64) eg_max_bytes_in_flight_kb * 1024;
		int64		bytes_claimable;
		int			ready;
		int64		backed_up_bytes;

		if (begin_round())
		{
			eg_http_set_max_connections(eg_max_concurrent_requests);
			next_claim_at = 0;
		}

		now = eg_now();
		db_ok = GetCurrentTimestamp() >= db_retry_at;
		if (db_ok && !leases_released)
		{
			leases_released = release_old_leases();
			db_ok = leases_released;
		}

		/*
		 * Claim in large sets while fewer requests wait than can be in
		 * flight, so HTTP never runs dry and each statement's fixed cost is
		 * spread over many rows.  Event bytes held stay under
		 * eventgrid.max_bytes_in_flight: a claim's result and the requests
		 * built from it both exist for a moment, so a claim takes at most
		 * half of what is left (and at least one event when nothing is held).
		 * Bytes waiting on a backed-up endpoint host do not count here: its
		 * subscriptions claim nothing more until it drains (endpoint.c).
		 */
		eg_targets_waiting(&ready, &backed_up_bytes);
		bytes_claimable = bytes_held - backed_up_bytes;
		want_claim = db_ok && leases_released && !eg_delivery_paused &&
			ready < eg_max_concurrent_requests && now >= next_claim_at &&
			(bytes_claimable == 0 || bytes_claimable < byte_limit / 2);
		if (want_claim)
		{
			bool		more;
			bool		locked;
			int			n = claim((byte_limit - bytes_claimable) / 2, &more, &locked);

			if (n < 0)
				next_claim_at = 0;	/* db_retry_at holds it back */
			else if (!more)
			{
				next_claim_at = next_due();

				/*
				 * Due retries or positions the claim did not get are locked
				 * by another session (SKIP LOCKED passed them by): look
				 * again a little later, not in a busy loop.  With several
				 * delivery workers that session is most likely another
				 * worker's claim, over within milliseconds.
				 */
				if (next_claim_at <= now || locked)
					next_claim_at = now + (TimestampTz) (eg_delivery_workers > 1 ? EG_PEER_LOCKED_RETRY_MS
														 : EG_LOCKED_DUE_RETRY_MS) * 1000;
			}
			else
				next_claim_at = now;
		}
		if (eg_targets_queued() > 0 && GetCurrentTimestamp() >= db_retry_at)
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
		if (eg_http_in_flight() > 0 && !want_claim)
			eg_http_wait(eg_http_in_flight() * 3 / 4, EG_BUSY_POLL_MS);
		collect_finished();

		/*
		 * Record outcomes in sets of hundreds; a smaller set waits at most a
		 * few milliseconds, or not at all once nothing is in flight.
		 */
		if (GetCurrentTimestamp() >= db_retry_at &&
			(recordable_n >= EG_RECORD_MIN_ROWS ||
			 (recordable_n > 0 &&
			  ((eg_http_in_flight() == 0 && eg_targets_queued() == 0) ||
			   GetCurrentTimestamp() - first_unrecorded_at >= EG_RECORD_MAX_DELAY_MS * 1000))))
		{
			TimestampTz earliest = record();

			if (earliest < next_claim_at)
				next_claim_at = earliest;
		}

		if (leases_released && worker_number == 1)
			ensure_upkeep_worker(DatumGetObjectId(arg));
		report_status(next_claim_at);

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

		if (eg_http_in_flight() == 0)
		{
			long		timeout_ms;
			TimestampTz wake_at = next_claim_at;

			now = eg_now();
			if (eg_delivery_paused && eg_targets_queued() == 0 && to_record_n == 0)
				wake_at = DT_NOEND; /* a reload (SIGHUP) sets the latch */
			if (eg_targets_queued() > 0 || recordable_n > 0 || !leases_released)
				wake_at = Min(wake_at, now);
			if (upkeep_handle == NULL && leases_released && worker_number == 1)
				wake_at = Min(wake_at, now + (upkeep_start_at - GetCurrentTimestamp()));
			if (GetCurrentTimestamp() < db_retry_at)
				wake_at = Max(wake_at, now + (db_retry_at - GetCurrentTimestamp()));
			timeout_ms = wake_at <= now ? 0
				: (long) Min((wake_at - now + 999) / 1000, (TimestampTz) EG_IDLE_MAX_SLEEP_MS);
			if (timeout_ms > 0)
			{
				int			rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
										   timeout_ms, PG_WAIT_EXTENSION);

				ResetLatch(MyLatch);
				if (rc & WL_LATCH_SET)
				{
					next_claim_at = 0;
					want_upkeep();
					/* a publish: the extension may just have been created or updated */
					if (eg_queue_readiness != EG_READY_OK && error_streak == 0)
						db_retry_at = 0;
				}
			}
		}
		else if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_claim_at = 0;
			want_upkeep();
		}
	}
}

/*
 * Background worker entry point of the upkeep worker, started by delivery
 * worker 1 for the database dboid: upkeep about once a second while the
 * delivery workers have work or an event table holds rows, once a minute
 * otherwise.  Exits when delivery worker 1 is gone (the next one starts a
 * new upkeep worker).
 */
void
eventgrid_upkeep_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	volatile TimestampTz last_upkeep = 0;
	volatile bool again = true;

	worker_start(arg, "upkeep worker", 0);
	eg_queue_quiet = true;

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		recover_from_error();
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		pid_t		delivery_pid;
		bool		wanted;

		if (begin_round())
			again = true;		/* new settings (e.g. the attempt history's) apply at once */
		SpinLockAcquire(&eg_shared->mutex);
		delivery_pid = eg_shared->worker_pid[0];
		wanted = eg_shared->upkeep_wanted;
		SpinLockRelease(&eg_shared->mutex);
		if (delivery_pid == 0 || kill(delivery_pid, 0) != 0)
			proc_exit(0);

		if (GetCurrentTimestamp() >= db_retry_at &&
			(wanted || again ||
			 GetCurrentTimestamp() - last_upkeep >= (TimestampTz) EG_UPKEEP_IDLE_INTERVAL_MS * 1000))
		{
			SpinLockAcquire(&eg_shared->mutex);
			eg_shared->upkeep_wanted = false;
			SpinLockRelease(&eg_shared->mutex);
			last_upkeep = GetCurrentTimestamp();
			again = true;		/* until upkeep says otherwise, also after an error */
			again = upkeep();
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 EG_UPKEEP_INTERVAL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
