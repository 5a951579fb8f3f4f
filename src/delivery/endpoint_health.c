/*
 * endpoint_health.c - the health of each endpoint URL (SPEC section 6,
 * delayed delivery).
 *
 * Each endpoint URL (event subscriptions with the same URL share it) counts
 * its consecutive failed delivery attempts.  At
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
 * with the outcomes (eg_targets_dirty, store_health.c), and read back when
 * a worker starts.  This file knows one endpoint at a time; the table of
 * them is endpoint_queue.c's.
 */
#include "delivery/endpoint.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

/* When the endpoint's probation time ends (0: not on probation; in the past: its probe is due or in flight). */
TimestampTz
eg_target_probation_until(const EgTarget *t)
{
	return t->probation_started != 0 ? t->probation_until : 0;
}

/* Does the endpoint of t hold its requests back now (on probation, or its probe in flight)? */
bool
eg_health_holds(const EgTarget *t, TimestampTz now)
{
	return t->probation_started != 0 && (t->probing || now < t->probation_until);
}

/*
 * Log lines name an endpoint by its host ("scheme://host:port", never the
 * path or query, which may hold a secret) and the event subscription whose
 * request changed its state; eventgrid.endpoint_health has the rest.
 */
static void
start_probation(EgTarget *t, const EgRequest *req, EgOutcomeCode outcome, TimestampTz now)
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
						t->consecutive_failures, eg_outcome_name(outcome)),
				 errdetail("Nothing is sent to it until then; deliveries that come due meanwhile are recorded with outcome Probation."),
				 errhint("See eventgrid.endpoint_health.")));
	}
	else
		ereport(DEBUG1,
				(errmsg("eventgrid: the endpoint of event subscription \"%s\" (%s) failed its probe (%s); probation %d lasts %lld s",
						req->subscription_name, t->host->key, eg_outcome_name(outcome), t->probations,
						(long long) (ms / 1000))));
	t->cause = outcome;
	t->probation_until = now + ms * 1000;
	t->dirty = true;
}

/*
 * A request to t was taken for sending: when t's probation time is over,
 * it is the probe (the others are held while it is in flight).
 */
void
eg_health_probe_started(EgTarget *t, EgRequest *req)
{
	if (t->probation_started == 0)
		return;
	req->probe = true;
	t->probing = true;
	t->dirty = true;
}

/* A request taken for sending was put back unsent: it is no longer the probe. */
void
eg_health_probe_unsent(EgTarget *t, EgRequest *req)
{
	if (!req->probe)
		return;
	req->probe = false;
	t->probing = false;
}

/*
 * The endpoint's health after a request to it finished with
 * req->transport and req->http_status.  Returns whether this ended a
 * probation.
 */
bool
eg_health_after_attempt(EgTarget *t, const EgRequest *req, TimestampTz now)
{
	EgOutcomeCode outcome = eg_outcome_of(req->transport, req->http_status);
	bool		healthy = eg_probation_ms(outcome, 1) < 0;
	bool		ended = false;

	if (req->probe)
		t->probing = false;

	if (outcome == EG_OUTCOME_DELIVERED || (req->probe && healthy))
	{
		if (t->probation_started != 0)
		{
			ereport(LOG,
					(errmsg("eventgrid: the endpoint of event subscription \"%s\" (%s) is healthy again: a delivery attempt succeeded after %d probations",
							req->subscription_name, t->host->key, t->probations),
					 errdetail("It was on probation since %s, first for outcome %s.",
							   timestamptz_to_str(t->probation_started), eg_outcome_name(t->cause))));
			ended = true;
		}
		if (t->consecutive_failures > 0 || t->probation_started != 0)
			t->dirty = true;
		t->consecutive_failures = 0;
		t->probations = 0;
		t->probation_started = 0;
		t->probation_until = 0;
		t->cause = EG_OUTCOME_NONE;
		return ended;
	}
	if (healthy)
		return false;			/* BadRequest, PayloadTooLarge: the event's problem */
	t->consecutive_failures++;
	t->last_failure = outcome;
	t->dirty = true;
	if (req->probe || (t->probation_started == 0 && t->consecutive_failures >= eg_probation_failures))
		start_probation(t, req, outcome, now);
	return false;
}

/* The health of endpoint t as eventgrid.endpoint_states keeps it (its texts t's own). */
void
eg_health_to_row(const EgTarget *t, EgHealth *e)
{
	e->endpoint = t->url;
	e->state = t->probation_started == 0 ? "healthy" : t->probing ? "probing" : "probation";
	e->consecutive_failures = t->consecutive_failures;
	e->last_failure_outcome = t->consecutive_failures > 0 ? t->last_failure : EG_OUTCOME_NONE;
	e->probation_cause = t->probation_started ? t->cause : EG_OUTCOME_NONE;
	e->probation_started_at = t->probation_started;
	e->probation_until = t->probation_started ? t->probation_until : 0;
	e->probations = t->probations;
}

/*
 * Takes over the health an earlier run of a worker wrote.  A probe that
 * was in flight then is lost: the endpoint is on probation, its probe due
 * when the probation time is over.
 */
void
eg_health_from_row(EgTarget *t, const EgHealth *e)
{
	t->consecutive_failures = e->consecutive_failures;
	t->last_failure = e->last_failure_outcome;
	t->probations = e->probations;
	t->probation_started = e->probation_started_at;
	t->probation_until = e->probation_until;
	t->cause = e->probation_cause;
	t->probing = false;
	t->dirty = strcmp(e->state, "probing") == 0;
}
