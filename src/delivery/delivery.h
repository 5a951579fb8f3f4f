/*
 * delivery.h - the state of one delivery worker, shared by its files:
 * delivery_worker.c (the claim -> deliver -> record loop, requests in
 * flight, status), delivery_claim.c (claimed rows become requests),
 * ordering.c (each key's events in order) and delivery_record.c (deciding
 * each delivery's outcome and writing outcomes back).
 */
#ifndef EVENTGRID_DELIVERY_H
#define EVENTGRID_DELIVERY_H

#include "core/eventgrid.h"
#include "http/http.h"
#include "core/outcome.h"
#include "store/store.h"

#include "lib/ilist.h"

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
	int64		subscription_id;
	bool		ordered;		/* of an ordered subscription (ordering.c) */
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
	EgOutcomeCode prev_outcome; /* outcome of the previous attempt */
	int32		prev_http_status;
	TimestampTz prev_attempted_at;	/* 0: none */
	const char *source;			/* events.source: the subscription it came through by logical replication, or NULL */
	bool		keyed;			/* a first attempt of an ordered subscription with an ordering key */
	bool		parked_key;		/* it was decided to retry or wait: its key waits until it is recorded */
	bool		claim_parked;	/* its key waited in the retries at its claim: never sent, it goes behind in its turn */
	int64		key_hash;		/* the key's hash, when keyed */
} EgDelivery;

/* The deliveries of one claim, freed when the last of them is recorded. */
typedef struct EgClaim
{
	MemoryContext cxt;
	EgDelivery *rows;
	int			unrecorded;
	uint64		no;				/* claims are numbered as they are made, from 1 */
	dlist_node	alive;			/* in eg_dw.claims_alive, oldest first */
} EgClaim;

/* What one delivery worker keeps between loop rounds. */
typedef struct EgDeliveryWorker
{
	int			lease_owner;	/* this delivery worker's pid */
	int			number;			/* 1 to eventgrid.delivery_workers */
	int64		bytes_held;		/* event bytes claimed and not yet recorded */
	int64		next_chunk_no;
	int64		next_wave_no;

	/* decided, not recorded (delivery_record.c) */
	EgDelivery **to_record;
	int			to_record_n;
	int			to_record_cap;
	int			recordable_n;	/* of those, how many may be recorded now */
	TimestampTz first_unrecorded_at;
	bool		recording;		/* a record unit is open */
	bool		isolate;		/* a record failed: record each subscription on its own */
	int64	   *poisoned;		/* subscriptions whose outcomes could not be recorded */
	int			poisoned_n;
	int			poisoned_cap;
	int			held_n;			/* of recordable_n, how many an isolated record could not write */
	TimestampTz held_until;		/* and they are not tried again on their own before this */

	/* recorded waves whose in-flight records can go */
	int64	   *waves_done;
	int			waves_done_n;
	int			waves_done_cap;

	/* a claim being turned into requests (in order); freed if its transaction fails */
	EgClaim    *claim_in_progress;
	uint64		claims_made;	/* the number of the last claim made */
	dlist_head	claims_alive;	/* claims some of whose rows are not recorded yet, oldest first */
	EgRequest  *built_head;
	EgRequest  *built_tail;
	TimestampTz last_analyze;
} EgDeliveryWorker;

extern EgDeliveryWorker eg_dw;

/* delivery_claim.c */
extern int	eg_delivery_claim(int64 byte_budget, bool *more, bool *locked, TimestampTz *next_due_at);
extern void eg_delivery_drop_claim(void);
extern void eg_delivery_claim_gone(EgClaim *claim);
extern uint64 eg_delivery_oldest_claim(void);

/* delivery_record.c */
extern void eg_delivery_push(EgDelivery *d);
extern void eg_delivery_decide(EgDelivery *d, EgTransport transport, int http_status, int64 retry_after_s,
							   TimestampTz started, TimestampTz now);
extern void eg_delivery_finish_unattempted(EgDelivery *d, EgAction action, EgFinalReason reason,
										   EgOutcomeCode outcome);
extern void eg_delivery_remember_attempt(EgRequest *req, TimestampTz started);
extern void eg_delivery_hold(EgRequest *req, TimestampTz now);
extern void eg_delivery_settled(EgRequest *req);
extern void eg_delivery_put_back(EgRequest *req, EgAction action);
extern void eg_delivery_token_failed(EgRequest *req, const char *error, TimestampTz now);
extern void eg_delivery_leave_wave(EgDelivery *d);
extern TimestampTz eg_delivery_record(void);
extern int	eg_delivery_recordable(void);

/*
 * ordering.c: each key's events in publish order within this worker (SPEC
 * 13), for the first attempts of ordered subscriptions.
 */
typedef enum EgOrderVerdict
{
	EG_ORDER_GO,				/* queue it */
	EG_ORDER_WAIT,				/* it waits for an earlier request of its keys */
	EG_ORDER_PARK				/* a key of it waits in the retries: so does it, unsent */
} EgOrderVerdict;

extern EgOrderVerdict eg_ordering_admit(EgRequest *req);
extern EgRequest **eg_ordering_done(EgRequest *req, int *n);
extern bool eg_ordering_parked(EgRequest *req);
extern void eg_ordering_recorded(EgDelivery *d);
extern void eg_ordering_chunk_claimed(EgChunk *c);
extern bool eg_ordering_chunk_ready(const EgChunk *c);
extern void eg_ordering_chunk_gone(const EgChunk *c);
extern int	eg_ordering_waiting(void);
extern int	eg_ordering_subscriptions(int64 **ids);
extern void eg_ordering_follow(EgAction (*fate) (const EgRequest *req, void *arg), void *arg);
extern EgAction eg_ordering_stopped(int64 sub);

/*
 * delivery_status.c: sets the worker's status line (next_claim_at: when
 * the next retry is due, for an idle worker), at most every 250 ms unless
 * its kind changed; logs pausing and resuming once each.
 */
extern void eg_delivery_report_status(TimestampTz next_claim_at);

/* delivery_worker.c: a delivery worker's main (the launcher starts it by name) */
extern PGDLLEXPORT void eventgrid_worker_main(Datum arg);

#endif							/* EVENTGRID_DELIVERY_H */
