/*
 * endpoint.h - the delivery worker's view of its endpoints: a fair queue of
 * requests per endpoint host (endpoint_queue.c, isolation) and the health
 * of each endpoint URL (endpoint_health.c, SPEC section 6, delayed
 * delivery).  An EgTarget is one endpoint URL; event subscriptions with the
 * same URL share it.
 */
#ifndef EVENTGRID_ENDPOINT_H
#define EVENTGRID_ENDPOINT_H

#include "core/eventgrid.h"
#include "core/outcome.h"
#include "http/http.h"
#include "store/store.h"
#include "utils/hsearch.h"

/* Requests to one host ("scheme://host:port"): a queue and a turn in the ring. */
typedef struct EgHost
{
	const char *key;			/* hash key: "scheme://host:port" */
	uint64		hash;			/* of key: its slot in the shared per-host counts */
	int			in_flight;		/* requests started (or about to be) by this worker */
	int			shared_in_flight;	/* of those, how many the shared count holds */
	int			queued;
	int64		queued_bytes;
	EgRequest  *head;			/* requests waiting, in order */
	EgRequest  *tail;
	int			targets;		/* URLs of this host known */
	bool		in_ring;
	bool		skipped;		/* a claim left its subscriptions out */
	int			http_version;	/* of its last answer: 2 HTTP/2, 1 HTTP/1.x, 0 not known yet */
	bool		tls;			/* https: HTTP/2 may be offered */
	TimestampTz first_sent_at;	/* when the request that learns its protocol went */
	struct EgHost *ring_next;
	struct EgHost *ring_prev;
} EgHost;

/* One endpoint URL: its host's queue and its health. */
typedef struct EgTarget
{
	const char *url;			/* hash key */
	EgHost	   *host;
	int			waiting;		/* requests queued or in flight */
	TimestampTz last_used;
	/* health (endpoint_health.c) */
	int			consecutive_failures;
	EgOutcomeCode last_failure;
	EgOutcomeCode cause;		/* outcome that started the probation */
	TimestampTz probation_started;	/* 0: healthy */
	TimestampTz probation_until;
	int			probations;		/* in a row since the last success */
	bool		probing;		/* the probe is in flight */
	bool		dirty;			/* not yet written to eventgrid.endpoint_states */
} EgTarget;

/* What eg_target_next() gives. */
typedef enum EgNext
{
	EG_NEXT_SEND,				/* a request to send */
	EG_NEXT_HOLD,				/* one its endpoint's probation holds back */
	EG_NEXT_NO_TOKEN			/* one whose bearer token could not be had */
} EgNext;

/* endpoint_queue.c */
extern HTAB *eg_targets_table;	/* url -> EgTarget; NULL until the first eg_target() */
extern EgTarget *eg_target(const char *url);
extern const char *eg_target_url(const EgTarget *t);
extern void eg_target_queue(EgRequest *req);
extern EgRequest *eg_target_next(TimestampTz now, bool may_send, EgNext *what);
extern void eg_target_unsend(EgRequest *req);
extern bool eg_target_finished(EgRequest *req, TimestampTz now);
extern int	eg_targets_queued(void);
extern void eg_targets_waiting(int *ready, int64 *backed_up_bytes);
extern int	eg_targets_skip_list(int64 **subs);
extern int	eg_targets_queued_subscriptions(int64 **subs);
extern EgRequest *eg_targets_take(bool (*take) (const EgRequest *req, void *arg), void *arg);
extern bool eg_targets_unblocked(void);
extern void eg_targets_sweep(TimestampTz now);
extern int	eg_targets_dirty(EgHealth **out);
extern void eg_targets_written(const EgHealth *written, int n);
extern void eg_targets_load(const EgHealth *rows, int n);
extern void eg_targets_release_hosts(void);

/* endpoint_health.c: one endpoint at a time */
extern TimestampTz eg_target_probation_until(const EgTarget *t);
extern bool eg_health_holds(const EgTarget *t, TimestampTz now);
extern void eg_health_probe_started(EgTarget *t, EgRequest *req);
extern void eg_health_probe_unsent(EgTarget *t, EgRequest *req);
extern bool eg_health_after_attempt(EgTarget *t, const EgRequest *req, TimestampTz now);
extern void eg_health_to_row(const EgTarget *t, EgHealth *e);
extern void eg_health_from_row(EgTarget *t, const EgHealth *e);

#endif							/* EVENTGRID_ENDPOINT_H */
