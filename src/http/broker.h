/*
 * broker.h - what the HTTP thread's broker destinations (redis_connections.c,
 * rabbitmq_connections.c) share (broker.c): the monotonic clock their
 * deadlines use, the end of a request, its lists, and a table of
 * connections, each known by its key — the endpoint's URL and the login,
 * so that subscriptions with other credentials never share a connection.
 * Plain C and malloc, like the rest of the HTTP thread.
 */
#ifndef EVENTGRID_BROKER_H
#define EVENTGRID_BROKER_H

#include "http/http.h"

/* A connection's key: first member of each destination's connection struct. */
typedef struct EgBrokerKey
{
	char	   *key;			/* url, a newline, the login (malloc'd; holds a secret) */
	size_t		len;
} EgBrokerKey;

/* The connections of one destination kind (the HTTP thread's). */
typedef struct EgBrokerTable
{
	EgBrokerKey **conns;
	int			n;
	int			cap;
} EgBrokerTable;

/* Milliseconds on CLOCK_MONOTONIC (a request's start and deadline; the wall clock may step). */
extern double eg_mono_ms(void);

/*
 * Ends req: its duration (it held its start time, eg_mono_ms(), since it
 * was handed over), text kept as the answer (transport OK) or the error,
 * and back to the main thread through eg_http_finish().
 */
extern void eg_broker_end(EgRequest *req, EgTransport transport, int status, const char *text);

/* req appended to a list (head, tail); the first taken off one (NULL when empty). */
extern void eg_request_push(EgRequest **head, EgRequest **tail, EgRequest *req);
extern EgRequest *eg_request_pop(EgRequest **head, EgRequest **tail);

/*
 * The connection of t whose key is url's first url_len bytes and login
 * (NULL: none), or a new one of size bytes (zeroed, its key set) added to
 * t; NULL when out of memory.
 */
extern void *eg_broker_conn_for(EgBrokerTable *t, size_t size, const char *url, size_t url_len, const char *login);

/* Forgets t's connection i (its key cleared); the last one takes its place. */
extern void eg_broker_conn_forget(EgBrokerTable *t, int i);

/* http.c, thread side: hands a finished request back to the main thread. */
extern void eg_http_finish(EgRequest *req, EgTransport transport, int http_status);

#endif							/* EVENTGRID_BROKER_H */
