/*
 * storage_queue.h - the StorageQueue destination (SPEC 21): an event
 * subscription whose endpoint_type is StorageQueue puts each event as a
 * message on an Azure Storage queue (Put Message), sent by the HTTP thread
 * like any request (storage_queue.c builds it).
 */
#ifndef EVENTGRID_STORAGE_QUEUE_H
#define EVENTGRID_STORAGE_QUEUE_H

#include "http/http.h"

/* A Storage queue, as its endpoint names it. */
typedef struct EgStorageQueue
{
	char		account[64];
	char		queue[64];
	char		path[1024];		/* the URL's path and /messages: what Put Message posts to */
	long		ttl_s;			/* queueMessageTimeToLiveInSeconds (messagettl), 0: the service's default */
} EgStorageQueue;

/* Parses a stored StorageQueue endpoint; NULL, or why not (static text). */
extern const char *eg_storage_parse(const char *endpoint, EgStorageQueue *q);

/* The Put Message URL of q (palloc'd), with the SAS token when sas is not NULL: a secret. */
extern char *eg_storage_put_url(const char *endpoint, const EgStorageQueue *q, const char *sas);

/*
 * req's body and headers: the event's JSON, base64-encoded, in a
 * QueueMessage; signed with account_key (base64) when it is not NULL.
 * EG_OUTCOME_NONE, or why it may not be sent.
 */
extern EgOutcomeCode eg_storage_request_build(EgRequest *req, const EgStorageQueue *q, const char *account_key,
											  const EgEventPart *event, StringInfo scratch);

/*
 * HTTP thread: did the Storage service refuse the request's credentials
 * (its 403 says x-ms-error-code: AuthenticationFailed: a wrong key, a SAS
 * token or bearer token it does not take, none)?  easy: the finished
 * transfer (CURL *).  Such a 403 is Unauthorized, as a 401 is; other 403s
 * (AuthorizationPermissionMismatch: no role for the queue) are Forbidden.
 */
extern bool eg_storage_credentials_refused(void *easy);

#endif							/* EVENTGRID_STORAGE_QUEUE_H */
