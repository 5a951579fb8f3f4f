/*
 * payload.c - request bodies and batch boundaries per delivery schema
 * (SPEC sections 2, 5 and 8).  Pure functions: the worker hands in the event
 * texts (already converted to the subscription's delivery schema by
 * eventgrid.convert_event() in the claim query) and gets back the body, the
 * content type and how many events go into the next batch.
 */
#include "eventgrid.h"

/*
 * Content-Type of a request.  Event Grid schema: application/json (a JSON
 * array even for one event).  CloudEvents structured mode:
 * application/cloudevents+json for one event, application/cloudevents-batch+json
 * for a batch.  Custom schema: application/json.
 */
const char *
eg_content_type(const char *delivery_schema, int nevents)
{
	if (strcmp(delivery_schema, "CloudEventSchemaV1_0") == 0)
		return nevents == 1 ? "application/cloudevents+json; charset=utf-8"
			: "application/cloudevents-batch+json; charset=utf-8";
	return "application/json; charset=utf-8";
}

/*
 * Builds the body: a JSON array for the Event Grid schema always and for any
 * batch of more than one event; the bare event for one CloudEvent or one
 * custom-schema event.
 */
void
eg_build_body(StringInfo buf, const char *delivery_schema,
			  const EgEventPart *events, int nevents)
{
	bool		array = nevents > 1 || strcmp(delivery_schema, "EventGridSchema") == 0;

	if (array)
		appendStringInfoChar(buf, '[');
	for (int i = 0; i < nevents; i++)
	{
		if (i > 0)
			appendStringInfoChar(buf, ',');
		appendBinaryStringInfo(buf, events[i].json, events[i].len);
	}
	if (array)
		appendStringInfoChar(buf, ']');
}

/*
 * How many of the leading events form the next batch: at most max_events,
 * and no more than max_bytes of body, except that the first event always goes
 * (an event larger than the preferred size travels alone, never dropped).
 * Optimistic: takes what is there, never waits for more.
 */
int
eg_batch_take(const EgEventPart *events, int nevents, int max_events, int64 max_bytes)
{
	int64		bytes = 2;		/* [ and ] */
	int			n = 0;

	while (n < nevents && n < max_events)
	{
		int64		add = events[n].len + (n > 0 ? 1 : 0);

		if (n > 0 && bytes + add > max_bytes)
			break;
		bytes += add;
		n++;
	}
	return Max(n, 1);
}
