/*
 * serve.h - Event Grid's HTTP data plane served by the cluster (SPEC 16):
 * the HTTP listener (listener.c, a background worker speaking HTTP through
 * libmicrohttpd) and its requests run in the database the URL names
 * (serve_db.c, through libpq, asynchronously).
 */
#ifndef EG_SERVE_H
#define EG_SERVE_H

#include "core/eventgrid.h"

#include "lib/stringinfo.h"

/* Largest request body the listener reads (Event Grid's 1 MB per request); more is 413. */
#define EG_HTTP_MAX_BODY (1024 * 1024)

/*
 * What every refused credential is answered (401), whatever was wrong and
 * whether the database or topic exists; the data plane's SQL
 * (eventgrid._http_unauthorized()) answers the same text.
 */
#define EG_HTTP_UNAUTHORIZED_MESSAGE "The request must carry one of the topic's access keys (aeg-sas-key, or Authorization: SharedAccessKey) or a shared access signature signed with one (aeg-sas-token) that has not expired."

#define EG_SERVE_MAX_PARAMS 12

/*
 * One statement of a request, run in database: sql (returning one row of
 * an HTTP status and the answer's body) with nparams text parameters.  The
 * caller's done() runs when status and answer are set (answer palloc'd in
 * cxt); all the call points to must live until then.
 */
typedef struct EgServeCall EgServeCall;
struct EgServeCall
{
	const char *database;
	const char *topic;			/* the topic the URL names: its long polls share the connections fairly */
	bool		long_poll;		/* a receive: may hold its connection for its maxWaitTime */
	const char *sql;
	int			nparams;
	const char *params[EG_SERVE_MAX_PARAMS];
	MemoryContext cxt;
	void		(*done) (EgServeCall *call);
	void	   *arg;			/* the caller's */
	int			status;			/* 0 until answered */
	char	   *answer;
};

/*
 * serve_db.c: runs call's statement on a free connection of its database
 * (as role eventgrid_http), or queues it until one is free and its share
 * allows: of eventgrid.http_max_requests_in_flight, one database's long
 * polls run on at most half and one topic's on at most a quarter (at
 * least one each), so that the long polls of one topic or database cannot
 * hold every connection; a call within its share never waits behind calls
 * that are over theirs.  A database that is not served is answered 401
 * (as a wrong key: an unauthenticated client cannot tell which databases
 * exist) and one that cannot be reached 503, at once (call->status is then
 * set when this returns, and done() ran).
 */
extern void eg_serve_start(EgServeCall *call);

/* serve_db.c: a descriptor that is readable when a statement's result may have arrived. */
extern int	eg_serve_wait_fd(void);

/* serve_db.c: answers the statements whose results arrived, and starts those that waited. */
extern void eg_serve_poll(void);

/*
 * serve_db.c: closes the connections to databases that DDL needs to itself
 * (cancelling a statement running there), that are gone or no longer have
 * the extension, or that were not used for a minute (the listener calls it
 * at least once a second).
 */
extern void eg_serve_tidy(void);

/*
 * publish_counts.c: counts a publish request to database's topic (as the
 * URL names them) that the listener answered status, with the
 * milliseconds from the whole request read to the answer (SPEC 16).
 */
extern void eg_publish_count(const char *database, const char *topic, int status, double latency_ms);

/*
 * publish_counts.c: writes the counts into their databases, one statement
 * each (eventgrid._http_count()), and forgets them; the listener calls it
 * every EG_HTTP_COUNT_FLUSH_MS.
 */
extern void eg_publish_counts_write(void);
#define EG_HTTP_COUNT_FLUSH_MS 5000

/* serve_db.c: closes the connections to the databases (the listener's exit). */
extern void eg_serve_disconnect(void);

/*
 * serve_db.c: the body {"error": {"code": code, "message": message}} every
 * error answer carries, spaced as the data plane's SQL writes it (jsonb's
 * text), so that the listener's 401 and the database's are the same bytes.
 */
extern char *eg_serve_error_body(const char *code, const char *message);

#endif							/* EG_SERVE_H */
