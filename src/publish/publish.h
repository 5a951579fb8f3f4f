/*
 * publish.h - what the files of the publish folder (publishing: the BEFORE
 * INSERT trigger on eventgrid.events, table change events, rows logical
 * replication brings) offer each other; nothing outside the folder calls
 * them.
 */
#ifndef EVENTGRID_PUBLISH_H
#define EVENTGRID_PUBLISH_H

#include "core/eventgrid.h"

#include "utils/jsonb.h"

/* publish.c: an event's size as JSON text (what the 1 MB limit applies to), and that limit */
extern int64 eg_event_text_size(Jsonb *jb);
/* publish.c: does this database have topic (eventgrid.topics, through SPI)? */
extern bool eg_topic_exists(const char *topic);
/* publish.c: the current local transaction id (MyProc's), to tell one transaction's calls from the next's */
extern LocalTransactionId eg_current_lxid(void);
extern void eg_check_event_size(int64 size);

/*
 * An event that logical replication brought for topic (topic_known: this
 * database has it), checked as a publish into it would check it (publish.c):
 * NULL when valid, with *stored the event as it is kept (stamped) and
 * *size its JSON text's size (recomputed, whatever was sent), and of a
 * domain *domain_topic the domain topic it names (else NULL); else why
 * not, palloc'd (the error a publish would have raised).  Never raises for
 * an invalid event.
 */
extern char *eg_check_replicated_event(const char *topic, bool topic_known, Jsonb *jb, Jsonb **stored,
									   char **domain_topic, int64 *size);
/* replication.c: eventgrid.events_id_seq's OID (event ids), kept for the backend's life */
extern Oid	eg_event_id_sequence(void);

#endif							/* EVENTGRID_PUBLISH_H */
