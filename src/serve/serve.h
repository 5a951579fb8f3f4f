/*
 * serve.h - Event Grid's HTTP data plane served by the cluster (SPEC 16):
 * the HTTP listener (listener.c, a background worker speaking HTTP through
 * libmicrohttpd) and its requests run in the database the URL names
 * (serve_db.c, through libpq).
 */
#ifndef EG_SERVE_H
#define EG_SERVE_H

#include "core/eventgrid.h"

#include "lib/stringinfo.h"

/* Largest request body the listener reads (Event Grid's 1 MB per request); more is 413. */
#define EG_HTTP_MAX_BODY (1024 * 1024)

/* A publish request (POST /{database}/topics/{topic}/api/events), as the listener read it. */
typedef struct EgPublishRequest
{
	const char *database;
	const char *topic;
	const char *path;			/* the URL's path, for a SAS token's resource */
	const char *sas_key;		/* header aeg-sas-key (NULL: absent) */
	const char *sas_token;		/* header aeg-sas-token */
	const char *authorization;	/* header Authorization */
	const char *content_type;
	const char *body;			/* body_len bytes, NUL-terminated */
	size_t		body_len;
} EgPublishRequest;

/*
 * serve_db.c: runs a publish request in its database as role eventgrid_http
 * (eventgrid._http_publish(), which checks the topic's keys); sets *status
 * (an HTTP status) and returns the answer's body (JSON, "" for none),
 * palloc'd.  A database that is not served is 404, a server that cannot be
 * reached 503.  Never raises an ERROR for the request's content.
 */
extern char *eg_serve_publish(const EgPublishRequest *req, int *status);

/*
 * serve_db.c: closes the connections to databases that DDL needs to itself,
 * that are gone or no longer have the extension, or that were not used for
 * a minute (the listener calls it at least once a second).
 */
extern void eg_serve_tidy(void);

/* serve_db.c: closes the connections to the databases (the listener's exit). */
extern void eg_serve_disconnect(void);

/* listener.c: the body {"error":{"code":code,"message":message}} every error answer carries. */
extern char *eg_serve_error_body(const char *code, const char *message);

#endif							/* EG_SERVE_H */
