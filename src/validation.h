/*
 * validation.h - endpoint validation (Event Grid's handshake), sent by the
 * upkeep worker for event subscriptions created or changed with
 * endpoint_validation => 'handshake' (validation.c, store_validation.c).
 */
#ifndef EG_VALIDATION_H
#define EG_VALIDATION_H

#include "eventgrid.h"

/* One endpoint validation to send, as eventgrid.endpoint_validations holds it. */
typedef struct EgValidation
{
	int64		subscription_id;
	char	   *topic;
	char	   *name;			/* the event subscription's */
	char	   *code;			/* the validation code sent */
	char	   *endpoint;
	bool		cloudevents;	/* the CloudEvents OPTIONS request, else a SubscriptionValidationEvent */
	char	   *body;			/* the SubscriptionValidationEvent (JSON array text) */
	char	   *headers;		/* static custom headers, "Name: value" lines, or NULL */
	int			rate;			/* max_events_per_second, 0: none */
	/* the answer */
	int			http_status;	/* 0: none */
	char	   *answer_body;	/* its first bytes, printable ASCII */
	char	   *allowed_origin; /* WebHook-Allowed-Origin, or NULL */
	char	   *allowed_rate;	/* WebHook-Allowed-Rate, or NULL */
	char	   *error;			/* libcurl's message when there was no answer, or NULL */
} EgValidation;

/* Sends each validation request (all at once, each at most 30 s); fills in the answers. */
extern void eg_validation_send(EgValidation *v, int n, const char *origin);

/*
 * store_validation.c: validations due at now (at most limit), copied into
 * cxt, after failing the manual validations that waited 10 minutes; *pending:
 * how many validations are not finished (when none is due; else at least
 * those due), to be looked at again soon.
 */
extern int	eg_store_due_validations(TimestampTz now, int limit, MemoryContext cxt, EgValidation **rows,
									 int64 *pending);
/* Records an answer; returns the new provisioning state, or NULL when the validation changed meanwhile. */
extern char *eg_store_record_validation(const EgValidation *v, const char *origin);

/* upkeep: sends the due validations and records them; returns whether some are not finished. */
extern bool eg_validate_endpoints(void);

#endif
