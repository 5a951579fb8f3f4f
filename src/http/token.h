/*
 * token.h - bearer tokens for protected receivers (SPEC section 12): the
 * OAuth 2.0 client-credentials grant (RFC 6749 section 4.4) that gets them,
 * its answer, and the tokens of every database kept in shared memory, one
 * per set of credentials (token endpoint, client, scope, audience), so that
 * the delivery workers and the upkeep worker of a database share one token
 * and one token request per lifetime.  Access tokens live only there and in
 * the memory of the process using them: never in a table, a log line or
 * the attempt history.
 */
#ifndef EVENTGRID_TOKEN_H
#define EVENTGRID_TOKEN_H

#include "core/eventgrid.h"
#include "http/http.h"

#define EG_TOKEN_SLOTS 64			/* sets of credentials whose tokens are kept at once (cluster) */
#define EG_TOKEN_MAX_BYTES 16384	/* longest access token taken */
#define EG_TOKEN_ENDPOINT_MAX 1000	/* bytes of a token endpoint URL */
#define EG_TOKEN_FIELD_MAX 500		/* bytes of a client id, scope or audience */
#define EG_TOKEN_ERROR_MAX 300		/* bytes of a token request's error text */
#define EG_TOKEN_ANSWER_MAX 65536	/* bytes of a token endpoint's answer read */
#define EG_TOKEN_DEFAULT_LIFETIME_S 3600	/* when the answer has no expires_in */
#define EG_TOKEN_FAILURE_HOLD_MS 1000	/* after a failed token request, the next waits this long */

/* One set of credentials: a client of a token endpoint (texts owned by the caller). */
typedef struct EgCredentials
{
	const char *method;			/* "oauth2" or "entra" */
	const char *token_endpoint;
	const char *client_id;
	const char *client_secret;
	const char *scope;			/* or NULL */
	const char *audience;		/* or NULL */
} EgCredentials;

/* What the shared slot of a set of credentials says (eg_token_lookup). */
typedef enum EgTokenState
{
	EG_TOKEN_READY,				/* a token serves: copied out */
	EG_TOKEN_READY_RENEW,		/* the same, near its end, and nobody asks for the next: the caller is to */
	EG_TOKEN_FETCH,				/* none, and nobody asks for one: the caller is to (it is marked as asking) */
	EG_TOKEN_FETCHING,			/* another process's token request is under way */
	EG_TOKEN_FAILED				/* the last token request failed moments ago: its error copied out */
} EgTokenState;

/* A token as copied out of its slot. */
typedef struct EgToken
{
	char		text[EG_TOKEN_MAX_BYTES + 1];
	int			len;
	uint64		generation;		/* changes whenever the slot's token is replaced or dropped */
	TimestampTz refresh_at;		/* serves until then (real time) */
	TimestampTz renew_at;		/* from then on a new one is asked for while it serves */
	char		error[EG_TOKEN_ERROR_MAX];	/* EG_TOKEN_FAILED: why */
} EgToken;

/* Shared memory (module.c's hooks). */
extern Size eg_token_shmem_size(void);
extern void eg_token_shmem_request(void);
extern void eg_token_shmem_init(void);

extern char *eg_entra_token_endpoint(const char *tenant_id);
extern bool eg_token_same_client(const EgCredentials *a, const EgCredentials *b);
extern EgTokenState eg_token_lookup(const EgCredentials *c, EgToken *out, bool may_renew);
extern void eg_token_store(const EgCredentials *c, const char *token, int len, int64 expires_in_s,
						   EgToken *out);
extern void eg_token_failed(const EgCredentials *c, const char *error);
extern void eg_token_drop(const EgCredentials *c, uint64 generation);
extern void eg_token_release_fetches(void);

/* The token request and its answer. */
extern void eg_token_request_prepare(EgRequest *req, const EgCredentials *c);
extern bool eg_token_answer(const EgCredentials *c, const EgRequest *req, char **token, int *len,
							int64 *expires_in_s, char *error, size_t errlen);
extern bool eg_token_get_now(const EgCredentials *c, const char *ca_file, EgToken *out);

#endif							/* EVENTGRID_TOKEN_H */
