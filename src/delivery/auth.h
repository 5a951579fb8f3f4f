/*
 * auth.h - bearer tokens on a delivery worker's requests (delivery_auth.c,
 * SPEC section 12): which credentials a subscription's requests use, whether
 * their token is there, and what a token request or a 401 changes.
 */
#ifndef EVENTGRID_AUTH_H
#define EVENTGRID_AUTH_H

#include "core/eventgrid.h"
#include "http/http.h"
#include "http/token.h"
#include "store/store.h"

struct EgTokenUse;

/* May a request that needs a bearer token go now? */
typedef enum EgAuthState
{
	EG_AUTH_READY,				/* its token is there (or it needs none) */
	EG_AUTH_WAIT,				/* a token request is under way: it waits in its queue */
	EG_AUTH_FAILED				/* no token could be had: it fails (eg_auth_error) */
} EgAuthState;

extern void eg_auth_credentials(const EgAuthRow *row, EgCredentials *c);
extern struct EgTokenUse *eg_auth_for(int64 sub_id, TimestampTz set_at);
extern void eg_auth_new_round(void);
extern EgAuthState eg_auth_state(EgRequest *req);
extern const char *eg_auth_error(const EgRequest *req);
extern void eg_auth_attach(EgRequest *req);
extern void eg_auth_token_finished(EgRequest *req);
extern bool eg_auth_refused(EgRequest *req);

#endif							/* EVENTGRID_AUTH_H */
