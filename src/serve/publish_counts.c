/*
 * publish_counts.c - what the HTTP listener answers to publish requests
 * (SPEC 16), counted in its own memory per database, topic and outcome
 * (Success, or the error code answered) with the successes' latency, and
 * written into each database every EG_HTTP_COUNT_FLUSH_MS as one statement
 * (eventgrid._http_count()), whatever the traffic: a flood of refused
 * requests costs a counter in memory each, not a write.  Read as Event
 * Grid's PublishFailCount and PublishSuccessLatencyInMs (views
 * topic_publish_metrics and metrics).
 *
 * The URL's database and topic are a client's words: at most
 * EG_HTTP_COUNT_KEYS different (database, topic) pairs are kept between two
 * writes, a request naming a new pair beyond that is counted under its
 * database with no topic, and the database maps a topic it does not have
 * to none.  The counts of a database that cannot be written to are
 * dropped.
 */
#include "serve/serve.h"

#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_HTTP_COUNT_KEYS 1000

typedef struct PublishCount
{
	char	   *database;
	char	   *topic;			/* "" : none (or too many) */
	const char *outcome;
	int64		requests;
	double		latency_ms;
} PublishCount;

static List *counts = NIL;		/* of PublishCount, in TopMemoryContext */
static List *finished = NIL;	/* memory contexts of writes that were answered: freed at the next write */

/* The outcome a status is counted under (eventgrid.http_publish_counts' check). */
static const char *
outcome_of(int status)
{
	switch (status)
	{
		case 200:
			return "Success";
		case 400:
			return "BadRequest";
		case 401:
			return "Unauthorized";
		case 404:
			return "NotFound";
		case 405:
			return "MethodNotAllowed";
		case 413:
			return "PayloadTooLarge";
		case 503:
			return "ServiceUnavailable";
		default:
			return "Other";
	}
}

/* See serve.h. */
void
eg_publish_count(const char *database, const char *topic, int status, double latency_ms)
{
	const char *outcome = outcome_of(status);
	ListCell   *lc;
	PublishCount *c;
	MemoryContext old;

	/* what is no topic's name is counted as none */
	if (!eg_is_topic_name(topic) || list_length(counts) >= EG_HTTP_COUNT_KEYS)
		topic = "";
	foreach(lc, counts)
	{
		c = lfirst(lc);
		if (c->outcome == outcome && strcmp(c->database, database) == 0 && strcmp(c->topic, topic) == 0)
		{
			c->requests++;
			c->latency_ms += latency_ms;
			return;
		}
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	c = palloc(sizeof(PublishCount));
	c->database = pstrdup(database);
	c->topic = pstrdup(topic);
	c->outcome = outcome;
	c->requests = 1;
	c->latency_ms = latency_ms;
	counts = lappend(counts, c);
	MemoryContextSwitchTo(old);
}

/* A write was answered: its memory is freed at the next write (its caller still reads the call). */
static void
write_done(EgServeCall *call)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

	finished = lappend(finished, call->cxt);
	MemoryContextSwitchTo(old);
}

/* See serve.h. */
void
eg_publish_counts_write(void)
{
	ListCell   *lc;

	foreach(lc, finished)
		MemoryContextDelete((MemoryContext) lfirst(lc));
	list_free(finished);
	finished = NIL;

	while (counts != NIL)
	{
		const char *database = ((PublishCount *) linitial(counts))->database;
		MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid publish counts", ALLOCSET_SMALL_SIZES);
		EgServeCall *call = MemoryContextAllocZero(cxt, sizeof(EgServeCall));
		StringInfoData json;
		List	   *rest = NIL;	/* the other databases' counts, in TopMemoryContext */
		MemoryContext old;

		/* one statement per database: its counts as [{topic, outcome, requests, latency_ms}, ...] */
		old = MemoryContextSwitchTo(cxt);
		initStringInfo(&json);
		call->database = pstrdup(database);
		MemoryContextSwitchTo(old);
		appendStringInfoChar(&json, '[');
		foreach(lc, counts)
		{
			PublishCount *c = lfirst(lc);

			if (strcmp(c->database, call->database) != 0)
			{
				old = MemoryContextSwitchTo(TopMemoryContext);
				rest = lappend(rest, c);
				MemoryContextSwitchTo(old);
				continue;
			}
			appendStringInfoString(&json, json.len > 1 ? ", {\"topic\": " : "{\"topic\": ");
			escape_json(&json, c->topic);
			appendStringInfoString(&json, ", \"outcome\": ");
			escape_json(&json, c->outcome);
			appendStringInfo(&json, ", \"requests\": " INT64_FORMAT ", \"latency_ms\": %.3f}", c->requests, c->latency_ms);
			/* written: forgotten (copied into the statement) */
			pfree(c->database);
			pfree(c->topic);
			pfree(c);
		}
		appendStringInfoChar(&json, ']');
		list_free(counts);
		counts = rest;

		call->sql = "SELECT 200 AS status, '' AS answer FROM eventgrid._http_count($1::jsonb)";
		call->nparams = 1;
		call->params[0] = json.data;
		call->cxt = cxt;
		call->done = write_done;
		eg_serve_start(call);
	}
}
