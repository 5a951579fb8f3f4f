/*
 * validation.h - endpoint validation (Event Grid's handshake), sent by the
 * upkeep worker for event subscriptions created or changed with
 * endpoint_validation => 'handshake' (validation.c, store_validation.c).
 */
#ifndef EG_VALIDATION_H
#define EG_VALIDATION_H

#include "core/eventgrid.h"
#include "store/store.h"

/* One endpoint validation to send, as eventgrid.endpoint_validations holds it. */
/* Sends each validation request (all at once, each at most 30 s); fills in the answers. */
extern void eg_validation_send(EgValidation *v, int n, const char *origin);

/*
 * store_validation.c: validations due at now (at most limit), copied into
 * cxt, after failing the manual validations that waited 10 minutes; *pending:
 * how many validations are not finished (when none is due; else at least
 * those due), to be looked at again soon.
 */
/* upkeep: sends the due validations and records them; returns whether some are not finished. */
extern bool eg_validate_endpoints(void);

#endif
