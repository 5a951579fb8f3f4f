/*
 * signing.h - Standard Webhooks signatures of delivery requests
 * (signing.c): the message id, the timestamp and the signature headers of
 * a signed event subscription's requests.
 */
#ifndef EVENTGRID_SIGNING_H
#define EVENTGRID_SIGNING_H

#include "core/eventgrid.h"

#include "lib/stringinfo.h"

/* The values of webhook-timestamp and webhook-signature of one request. */
typedef struct EgSignature
{
	char		timestamp[24];	/* Unix seconds */
	StringInfoData signature;	/* "v1,<base64>", space-separated, one per key */
} EgSignature;

extern char *eg_webhook_id(int64 subscription_id, const int64 *ids, int n);
extern void eg_sign_request(EgSignature *sig, const char *keys, const char *webhook_id,
							const char *body, size_t body_len);

#endif							/* EVENTGRID_SIGNING_H */
