/*
 * url.h - endpoint URLs (url.c): which ones eventgrid accepts, and the
 * host an endpoint's requests queue behind.  libcurl's URL API parses them,
 * the same parser the requests use.
 */
#ifndef EVENTGRID_URL_H
#define EVENTGRID_URL_H

#include "core/eventgrid.h"

/*
 * Longest endpoint URL accepted, in bytes.  Below PostgreSQL's btree key
 * limit (about 2.7 kB), so the endpoint's health row always fits its
 * index, and the length most HTTP stacks and proxies take in a request
 * line.
 */
#define EG_MAX_ENDPOINT_BYTES 2048

extern const char *eg_endpoint_problem(const char *url);
extern const char *eg_destination_url(const char *url, size_t scheme_len, char *host, size_t host_cap, int *port,
									  char **path, char **query);
extern bool eg_url_decode(const char *value, char *out, size_t cap);
extern char *eg_url_host_key(const char *url);
extern char *eg_uri_escape(const char *s, int len);

#endif							/* EVENTGRID_URL_H */
