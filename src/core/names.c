/*
 * names.c - the shape of the names eventgrid gives things, checked in C as
 * the SQL checks them.
 */
#include "core/eventgrid.h"

/*
 * Whether s is a topic's (or a domain topic's) name: 3 to
 * EG_TOPIC_NAME_MAX letters, digits and hyphens, as eventgrid._is_topic_name()
 * says in SQL.
 */
bool
eg_is_topic_name(const char *s)
{
	size_t		len = strlen(s);

	if (len < 3 || len > EG_TOPIC_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
			  s[i] == '-'))
			return false;
	return true;
}
