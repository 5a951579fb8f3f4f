/*
 * filter.c - Event Grid advanced filters (SPEC section 9):
 * checking a subscription's filters when they are set, and matching an
 * event against them in the claim queries.
 *
 * A subscription's filters are kept as Event Grid's own JSON, an array of
 * {"operatorType": ..., "key": ..., "value": ...} or {..., "values": [...]}
 * objects.  eventgrid._check_advanced_filters() refuses what Event Grid
 * refuses (22023 for malformed filters, 54000 for the limits), naming the
 * filter's position and field.  eventgrid._advanced_match() compiles the
 * filters once per distinct filter text (cached in fn_extra) and tests an
 * event: filters are AND'ed, the values of one filter OR'ed; strings compare
 * case-insensitively; a missing key matches only NumberNotIn, StringNotIn
 * and IsNullOrUndefined; a value of the wrong JSON type matches nothing.
 */
#include "core/eventgrid.h"

#include <math.h>

#include "catalog/pg_collation.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/formatting.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#define EG_MAX_ADVANCED_FILTERS 25
#define EG_MAX_FILTER_VALUES 25
#define EG_MAX_FILTER_STRING_CHARS 512

typedef enum EgFilterOp
{
	OP_NUMBER_IN,
	OP_NUMBER_NOT_IN,
	OP_NUMBER_LESS_THAN,
	OP_NUMBER_GREATER_THAN,
	OP_NUMBER_LESS_THAN_OR_EQUALS,
	OP_NUMBER_GREATER_THAN_OR_EQUALS,
	OP_NUMBER_IN_RANGE,
	OP_NUMBER_NOT_IN_RANGE,
	OP_BOOL_EQUALS,
	OP_STRING_CONTAINS,
	OP_STRING_NOT_CONTAINS,
	OP_STRING_BEGINS_WITH,
	OP_STRING_NOT_BEGINS_WITH,
	OP_STRING_ENDS_WITH,
	OP_STRING_NOT_ENDS_WITH,
	OP_STRING_IN,
	OP_STRING_NOT_IN,
	OP_IS_NULL_OR_UNDEFINED,
	OP_IS_NOT_NULL
} EgFilterOp;

/* What an operator takes: one "value", a list of "values", or nothing. */
typedef enum EgFilterArg
{
	ARG_NUMBER,					/* "value": a number */
	ARG_BOOL,					/* "value": a boolean */
	ARG_NUMBERS,				/* "values": numbers */
	ARG_RANGES,					/* "values": [low, high] pairs of numbers */
	ARG_STRINGS,				/* "values": strings */
	ARG_NONE
} EgFilterArg;

static const struct
{
	const char *name;
	EgFilterOp	op;
	EgFilterArg arg;
	EgFilterOp	positive;		/* the operator it negates, or itself */
	bool		negated;
	bool		missing_matches;	/* a missing key matches */
}			eg_ops[] = {
	{"NumberIn", OP_NUMBER_IN, ARG_NUMBERS, OP_NUMBER_IN, false, false},
	{"NumberNotIn", OP_NUMBER_NOT_IN, ARG_NUMBERS, OP_NUMBER_IN, true, true},
	{"NumberLessThan", OP_NUMBER_LESS_THAN, ARG_NUMBER, OP_NUMBER_LESS_THAN, false, false},
	{"NumberGreaterThan", OP_NUMBER_GREATER_THAN, ARG_NUMBER, OP_NUMBER_GREATER_THAN, false, false},
	{"NumberLessThanOrEquals", OP_NUMBER_LESS_THAN_OR_EQUALS, ARG_NUMBER,
	OP_NUMBER_LESS_THAN_OR_EQUALS, false, false},
	{"NumberGreaterThanOrEquals", OP_NUMBER_GREATER_THAN_OR_EQUALS, ARG_NUMBER,
	OP_NUMBER_GREATER_THAN_OR_EQUALS, false, false},
	{"NumberInRange", OP_NUMBER_IN_RANGE, ARG_RANGES, OP_NUMBER_IN_RANGE, false, false},
	{"NumberNotInRange", OP_NUMBER_NOT_IN_RANGE, ARG_RANGES, OP_NUMBER_IN_RANGE, true, false},
	{"BoolEquals", OP_BOOL_EQUALS, ARG_BOOL, OP_BOOL_EQUALS, false, false},
	{"StringContains", OP_STRING_CONTAINS, ARG_STRINGS, OP_STRING_CONTAINS, false, false},
	{"StringNotContains", OP_STRING_NOT_CONTAINS, ARG_STRINGS, OP_STRING_CONTAINS, true, false},
	{"StringBeginsWith", OP_STRING_BEGINS_WITH, ARG_STRINGS, OP_STRING_BEGINS_WITH, false, false},
	{"StringNotBeginsWith", OP_STRING_NOT_BEGINS_WITH, ARG_STRINGS, OP_STRING_BEGINS_WITH, true, false},
	{"StringEndsWith", OP_STRING_ENDS_WITH, ARG_STRINGS, OP_STRING_ENDS_WITH, false, false},
	{"StringNotEndsWith", OP_STRING_NOT_ENDS_WITH, ARG_STRINGS, OP_STRING_ENDS_WITH, true, false},
	{"StringIn", OP_STRING_IN, ARG_STRINGS, OP_STRING_IN, false, false},
	{"StringNotIn", OP_STRING_NOT_IN, ARG_STRINGS, OP_STRING_IN, true, true},
	{"IsNullOrUndefined", OP_IS_NULL_OR_UNDEFINED, ARG_NONE, OP_IS_NULL_OR_UNDEFINED, false, true},
	{"IsNotNull", OP_IS_NOT_NULL, ARG_NONE, OP_IS_NOT_NULL, false, false},
};

/* One compiled filter. */
typedef struct EgFilter
{
	int			kind;			/* index into eg_ops */
	char	  **path;			/* key split at '.' */
	int		   *path_len;
	int			npath;
	const char *alias;			/* the other schema's name of the first key, or NULL */
	int			nvalues;
	double	   *numbers;		/* ARG_NUMBER(S): nvalues; ARG_RANGES: 2 * nvalues */
	bool		boolean;
	char	  **strings;		/* lower-cased */
	int		   *string_len;
} EgFilter;

typedef struct EgFilterSet
{
	int			nfilters;
	EgFilter   *filters;
} EgFilterSet;

/*
 * Envelope fields have other names in the other schema; a key naming one
 * finds it in events of either (Event Grid schema <-> CloudEvents 1.0).
 */
static const char *const eg_aliases[][2] = {
	{"eventType", "type"}, {"topic", "source"}, {"dataVersion", "dataversion"}, {"eventTime", "time"},
};

/* Hints that more than one check gives. */
#define HINT_OPERATORS \
	"operatorType is one of NumberIn, NumberNotIn, NumberLessThan, NumberGreaterThan, NumberLessThanOrEquals, NumberGreaterThanOrEquals, NumberInRange, NumberNotInRange, BoolEquals, StringContains, StringNotContains, StringBeginsWith, StringNotBeginsWith, StringEndsWith, StringNotEndsWith, StringIn, StringNotIn, IsNullOrUndefined, IsNotNull."
#define HINT_VALUE_OR_VALUES \
	"NumberLessThan, NumberGreaterThan, NumberLessThanOrEquals, NumberGreaterThanOrEquals and BoolEquals take one \"value\"; the other operators take \"values\"."
#define HINT_RANGES \
	"NumberInRange and NumberNotInRange take values such as [[0, 10], [20, 30]]: inclusive [low, high] pairs."

pg_noreturn static void
filter_error(int sqlstate, int pos, const char *opname, const char *hint, const char *fmt,...)
pg_attribute_printf(5, 6);

static void
filter_error(int sqlstate, int pos, const char *opname, const char *hint, const char *fmt,...)
{
	char		detail[512];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	if (opname)
		ereport(ERROR,
				(errcode(sqlstate),
				 errmsg("advanced filter %d (%s): %s", pos, opname, detail),
				 hint ? errhint("%s", hint) : 0));
	ereport(ERROR,
			(errcode(sqlstate),
			 errmsg("advanced filter %d: %s", pos, detail),
			 hint ? errhint("%s", hint) : 0));
}

static bool
get_field(JsonbContainer *obj, const char *name, JsonbValue *out)
{
	return getKeyJsonValueFromContainer(obj, name, strlen(name), out) != NULL;
}

static double
numeric_to_double(Numeric n)
{
	return DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow, NumericGetDatum(n)));
}

static char *
lower_text(const char *s, int len, int *out_len)
{
	char	   *l = str_tolower(s, len, DEFAULT_COLLATION_OID);

	*out_len = strlen(l);
	return l;
}

static const char *
json_type_name(const JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return "null";
		case jbvString:
			return "a string";
		case jbvNumeric:
			return "a number";
		case jbvBool:
			return "a boolean";
		case jbvBinary:
			return JsonContainerIsArray(v->val.binary.data) ? "an array" : "an object";
		default:
			return "a value";
	}
}

static double
filter_number(const JsonbValue *v, int pos, const char *opname, const char *field)
{
	double		d;

	if (v->type != jbvNumeric)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "%s must be a number, got %s", field, json_type_name(v));
	d = numeric_to_double(v->val.numeric);
	if (isinf(d) || isnan(d))
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "%s is out of the range of a double-precision number", field);
	return d;
}

/*
 * Adds n values of filter pos (its field "value" or "values") to the count
 * over all filters; 54000 past the limit.
 */
static void
charge_values(int pos, const char *opname, const char *field, int n, int *total_values)
{
	if (*total_values + n > EG_MAX_FILTER_VALUES)
		filter_error(ERRCODE_PROGRAM_LIMIT_EXCEEDED, pos, opname,
					 "Event Grid allows 25 advanced filter values in all per event subscription.",
					 "%s brings the advanced filter values to %d, more than %d in all",
					 field, *total_values + n, EG_MAX_FILTER_VALUES);
	*total_values += n;
}

/* The key of filter obj (a dotted path of non-empty names, e.g. data.order.total) into f. */
static void
compile_key(JsonbContainer *obj, int pos, const char *opname, EgFilter *f)
{
	JsonbValue	keyv;
	char	   *key;

	if (!get_field(obj, "key", &keyv))
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
					 "key names an event field: an envelope field such as subject or eventType, or a data field by dotted path such as data.order.total.",
					 "key is missing");
	if (keyv.type != jbvString)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "key must be a string, got %s", json_type_name(&keyv));
	if (keyv.val.string.len == 0 || keyv.val.string.len > EG_MAX_FILTER_STRING_CHARS)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "key must have 1 to %d characters", EG_MAX_FILTER_STRING_CHARS);
	key = pnstrdup(keyv.val.string.val, keyv.val.string.len);
	f->npath = 1;
	for (char *c = key; *c; c++)
		f->npath += (*c == '.');
	f->path = palloc(f->npath * sizeof(char *));
	f->path_len = palloc(f->npath * sizeof(int));
	{
		char	   *start = key;

		for (int i = 0; i < f->npath; i++)
		{
			char	   *dot = strchr(start, '.');

			if (dot)
				*dot = '\0';
			if (*start == '\0')
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
							 "key \"%.64s\" has an empty name between dots",
							 pnstrdup(keyv.val.string.val, keyv.val.string.len));
			f->path[i] = start;
			f->path_len[i] = strlen(start);
			start = dot ? dot + 1 : start + f->path_len[i];
		}
	}
	for (int i = 0; i < (int) lengthof(eg_aliases); i++)
		for (int j = 0; j < 2; j++)
			if (pg_strcasecmp(f->path[0], eg_aliases[i][j]) == 0)
				f->alias = eg_aliases[i][1 - j];

}

/*
 * The "values" of a filter taking several (numbers, [low, high] ranges or
 * strings) into f, each checked and counted against the 25 values in all.
 */
static void
compile_values(JsonbValue *valuesv, bool has_value, bool has_values, int pos, const char *opname,
			   EgFilterArg arg, EgFilter *f, int *total_values)
{
	JsonbContainer *arr;

	if (has_value || !has_values)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
					 HINT_VALUE_OR_VALUES,
					 "needs \"values\", not \"value\"");
	if (valuesv->type != jbvBinary || !JsonContainerIsArray(valuesv->val.binary.data))
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "values must be an array, got %s", json_type_name(valuesv));
	arr = valuesv->val.binary.data;
	f->nvalues = JsonContainerSize(arr);
	if (f->nvalues == 0)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
					 "values must hold at least one value");
	charge_values(pos, opname, "values", f->nvalues, total_values);
	if (arg == ARG_STRINGS)
	{
		f->strings = palloc(f->nvalues * sizeof(char *));
		f->string_len = palloc(f->nvalues * sizeof(int));
	}
	else
		f->numbers = palloc(f->nvalues * 2 * sizeof(double));
	for (int i = 0; i < f->nvalues; i++)
	{
		JsonbValue *v = getIthJsonbValueFromContainer(arr, i);
		char		field[32];

		snprintf(field, sizeof(field), "values[%d]", i);
		if (arg == ARG_NUMBERS)
			f->numbers[i] = filter_number(v, pos, opname, field);
		else if (arg == ARG_STRINGS)
		{
			if (v->type != jbvString)
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
							 "%s must be a string, got %s", field, json_type_name(v));
			if (pg_mbstrlen_with_len(v->val.string.val, v->val.string.len) > EG_MAX_FILTER_STRING_CHARS)
				filter_error(ERRCODE_PROGRAM_LIMIT_EXCEEDED, pos, opname,
							 "Event Grid allows string filter values of up to 512 characters.",
							 "%s has more than %d characters", field, EG_MAX_FILTER_STRING_CHARS);
			f->strings[i] = lower_text(v->val.string.val, v->val.string.len, &f->string_len[i]);
		}
		else
		{
			JsonbContainer *pair = v->type == jbvBinary ? v->val.binary.data : NULL;

			if (pair == NULL || !JsonContainerIsArray(pair) || JsonContainerSize(pair) != 2)
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
							 HINT_RANGES,
							 "%s must be a [low, high] pair of numbers", field);
			f->numbers[2 * i] = filter_number(getIthJsonbValueFromContainer(pair, 0),
											  pos, opname, field);
			f->numbers[2 * i + 1] = filter_number(getIthJsonbValueFromContainer(pair, 1),
												  pos, opname, field);
			if (f->numbers[2 * i] > f->numbers[2 * i + 1])
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
							 HINT_RANGES,
							 "%s has low greater than high", field);
		}
	}
}

/*
 * Checks one filter object (1-based position pos) and compiles it into f;
 * *total_values counts values over all filters for the limit.
 */
static void
compile_filter(JsonbValue *elem, int pos, EgFilter *f, int *total_values)
{
	JsonbContainer *obj;
	JsonbValue	opv,
				valuev,
				valuesv,
				tok;
	JsonbIterator *it;
	JsonbIteratorToken r;
	bool		has_value,
				has_values;
	const char *opname;
	EgFilterArg arg;

	memset(f, 0, sizeof(*f));
	if (elem->type != jbvBinary || !JsonContainerIsObject(elem->val.binary.data))
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, NULL,
					 "Each advanced filter is an object such as {\"operatorType\": \"StringIn\", \"key\": \"data.color\", \"values\": [\"blue\"]}.",
					 "must be a JSON object, got %s", json_type_name(elem));
	obj = elem->val.binary.data;

	/* no fields but Event Grid's own: a misspelled "values" must not pass silently */
	it = JsonbIteratorInit(obj);
	while ((r = JsonbIteratorNext(&it, &tok, true)) != WJB_DONE)
	{
		if (r != WJB_KEY)
			continue;
		if (!((tok.val.string.len == 12 && memcmp(tok.val.string.val, "operatorType", 12) == 0) ||
			  (tok.val.string.len == 3 && memcmp(tok.val.string.val, "key", 3) == 0) ||
			  (tok.val.string.len == 5 && memcmp(tok.val.string.val, "value", 5) == 0) ||
			  (tok.val.string.len == 6 && memcmp(tok.val.string.val, "values", 6) == 0)))
			filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, NULL,
						 "The fields of an advanced filter are operatorType, key, and value or values.",
						 "unknown field \"%.*s\"", Min(tok.val.string.len, 64), tok.val.string.val);
	}

	if (!get_field(obj, "operatorType", &opv) || opv.type != jbvString)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, NULL,
					 HINT_OPERATORS,
					 "operatorType must be a string naming the operator");
	f->kind = -1;
	for (int i = 0; i < (int) lengthof(eg_ops); i++)
		if (strlen(eg_ops[i].name) == (size_t) opv.val.string.len &&
			pg_strncasecmp(eg_ops[i].name, opv.val.string.val, opv.val.string.len) == 0)
			f->kind = i;
	if (f->kind < 0)
		filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, NULL,
					 HINT_OPERATORS,
					 "unknown operatorType \"%.*s\"", Min(opv.val.string.len, 64), opv.val.string.val);
	opname = eg_ops[f->kind].name;
	arg = eg_ops[f->kind].arg;

	compile_key(obj, pos, opname, f);

	has_value = get_field(obj, "value", &valuev);
	has_values = get_field(obj, "values", &valuesv);
	switch (arg)
	{
		case ARG_NONE:
			if (has_value || has_values)
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
							 "IsNullOrUndefined and IsNotNull take only a key.",
							 "takes no value");
			break;
		case ARG_NUMBER:
		case ARG_BOOL:
			if (has_values || !has_value)
				filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname,
							 HINT_VALUE_OR_VALUES,
							 "needs \"value\", not \"values\"");
			f->nvalues = 1;
			if (arg == ARG_BOOL)
			{
				if (valuev.type != jbvBool)
					filter_error(ERRCODE_INVALID_PARAMETER_VALUE, pos, opname, NULL,
								 "value must be a boolean, got %s", json_type_name(&valuev));
				f->boolean = valuev.val.boolean;
			}
			else
			{
				f->numbers = palloc(sizeof(double));
				f->numbers[0] = filter_number(&valuev, pos, opname, "value");
			}
			break;
		case ARG_NUMBERS:
		case ARG_RANGES:
		case ARG_STRINGS:
			compile_values(&valuesv, has_value, has_values, pos, opname, arg, f, total_values);
			break;
	}
	if (arg == ARG_NUMBER || arg == ARG_BOOL)
		charge_values(pos, opname, "value", 1, total_values);
}

/* Checks and compiles a filter array, in the current memory context. */
static EgFilterSet *
compile_filters(Jsonb *filters)
{
	EgFilterSet *set = palloc0(sizeof(EgFilterSet));
	int			total_values = 0;

	if (!JB_ROOT_IS_ARRAY(filters) || JB_ROOT_IS_SCALAR(filters))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("advanced filters must be a JSON array of filter objects"),
				 errhint("For example [{\"operatorType\": \"NumberGreaterThan\", \"key\": \"data.total\", \"value\": 100}]; NULL or [] removes them.")));
	set->nfilters = JB_ROOT_COUNT(filters);
	if (set->nfilters > EG_MAX_ADVANCED_FILTERS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("at most %d advanced filters per event subscription, got %d",
						EG_MAX_ADVANCED_FILTERS, set->nfilters),
				 errhint("Event Grid allows 25 advanced filters per event subscription.")));
	set->filters = palloc0(Max(set->nfilters, 1) * sizeof(EgFilter));
	for (int i = 0; i < set->nfilters; i++)
		compile_filter(getIthJsonbValueFromContainer(&filters->root, i), i + 1, &set->filters[i],
					   &total_values);
	return set;
}

/*
 * The value of the key of object obj that is name[0..len) but for ASCII
 * letter case, the first such key in the object's order, or NULL.  For
 * keys whose case differs from the filter's; an exact key is found first,
 * by jsonb's own binary search.
 */
static JsonbValue *
get_key_any_case(JsonbContainer *obj, const char *name, int len, JsonbValue *out)
{
	JsonbIterator *it = JsonbIteratorInit(obj);
	JsonbIteratorToken tok;
	JsonbValue	v;
	bool		take = false;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			take = v.val.string.len == len && pg_strncasecmp(v.val.string.val, name, len) == 0;
		else if (tok == WJB_VALUE && take)
		{
			*out = v;
			return out;
		}
	}
	return NULL;
}

/* The value of key name[0..len) of object c, exactly or else in any letter case, or NULL. */
static JsonbValue *
get_key(JsonbContainer *c, const char *name, int len, JsonbValue *out)
{
	if (getKeyJsonValueFromContainer(c, name, len, out) != NULL)
		return out;
	return get_key_any_case(c, name, len, out);
}

/*
 * The value at f's key in the event, or false when the key is missing.
 * Names match whatever their case, as in Event Grid (data.color finds
 * Data.Color): an exact name first, else the first that differs only in
 * ASCII letter case.
 */
static bool
lookup(JsonbContainer *event, const EgFilter *f, JsonbValue *out)
{
	JsonbContainer *c = event;

	for (int i = 0; i < f->npath; i++)
	{
		if (c == NULL || !JsonContainerIsObject(c))
			return false;
		if (get_key(c, f->path[i], f->path_len[i], out) == NULL)
		{
			if (i > 0 || f->alias == NULL ||
				get_key(c, f->alias, strlen(f->alias), out) == NULL)
				return false;
		}
		c = out->type == jbvBinary ? out->val.binary.data : NULL;
	}
	return true;
}

typedef enum
{
	M_NO,
	M_YES,
	M_WRONG_TYPE
} EgMatch;

static bool
contains(const char *hay, int hlen, const char *needle, int nlen)
{
	if (nlen == 0)
		return true;
	for (int i = 0; i + nlen <= hlen; i++)
		if (hay[i] == needle[0] && memcmp(hay + i, needle, nlen) == 0)
			return true;
	return false;
}

/* Does one scalar v satisfy f's positive operator with any of its values? */
static EgMatch
match_one(const EgFilter *f, const JsonbValue *v)
{
	EgFilterOp	op = eg_ops[f->kind].positive;

	switch (eg_ops[f->kind].arg)
	{
		case ARG_NUMBER:
		case ARG_NUMBERS:
		case ARG_RANGES:
			{
				double		d;

				if (v->type != jbvNumeric)
					return M_WRONG_TYPE;
				d = numeric_to_double(v->val.numeric);
				for (int i = 0; i < f->nvalues; i++)
				{
					bool		m;

					switch (op)
					{
						case OP_NUMBER_IN:
							m = d == f->numbers[i];
							break;
						case OP_NUMBER_LESS_THAN:
							m = d < f->numbers[i];
							break;
						case OP_NUMBER_GREATER_THAN:
							m = d > f->numbers[i];
							break;
						case OP_NUMBER_LESS_THAN_OR_EQUALS:
							m = d <= f->numbers[i];
							break;
						case OP_NUMBER_GREATER_THAN_OR_EQUALS:
							m = d >= f->numbers[i];
							break;
						default:	/* OP_NUMBER_IN_RANGE */
							m = d >= f->numbers[2 * i] && d <= f->numbers[2 * i + 1];
							break;
					}
					if (m)
						return M_YES;
				}
				return M_NO;
			}
		case ARG_BOOL:
			if (v->type != jbvBool)
				return M_WRONG_TYPE;
			return v->val.boolean == f->boolean ? M_YES : M_NO;
		case ARG_STRINGS:
			{
				int			len;
				char	   *s;

				if (v->type != jbvString)
					return M_WRONG_TYPE;
				s = lower_text(v->val.string.val, v->val.string.len, &len);
				for (int i = 0; i < f->nvalues; i++)
				{
					const char *w = f->strings[i];
					int			wl = f->string_len[i];
					bool		m;

					switch (op)
					{
						case OP_STRING_CONTAINS:
							m = contains(s, len, w, wl);
							break;
						case OP_STRING_BEGINS_WITH:
							m = len >= wl && memcmp(s, w, wl) == 0;
							break;
						case OP_STRING_ENDS_WITH:
							m = len >= wl && memcmp(s + len - wl, w, wl) == 0;
							break;
						default:	/* OP_STRING_IN */
							m = len == wl && memcmp(s, w, wl) == 0;
							break;
					}
					if (m)
					{
						pfree(s);
						return M_YES;
					}
				}
				pfree(s);
				return M_NO;
			}
		case ARG_NONE:
			break;
	}
	return M_WRONG_TYPE;
}

/*
 * Does the event pass filter f?  With on_arrays, an array value is tested
 * element by element: a positive operator matches when any element does, a
 * negated one (NumberNotIn, StringNotContains, ...) when no element matches
 * the operator it negates, as Event Grid documents; elements of the wrong
 * type are passed over, and an array with none of the right type matches
 * nothing.  Without on_arrays an array is a value of the wrong type.
 */
static bool
filter_passes(JsonbContainer *event, const EgFilter *f, bool on_arrays)
{
	JsonbValue	v;
	bool		negated = eg_ops[f->kind].negated;

	if (!lookup(event, f, &v))
		return eg_ops[f->kind].missing_matches;
	if (eg_ops[f->kind].op == OP_IS_NULL_OR_UNDEFINED)
		return v.type == jbvNull;
	if (eg_ops[f->kind].op == OP_IS_NOT_NULL)
		return v.type != jbvNull;
	if (v.type == jbvBinary && JsonContainerIsArray(v.val.binary.data))
	{
		JsonbContainer *arr = v.val.binary.data;
		int			n = JsonContainerSize(arr);
		bool		typed = false,
					any = false;

		if (!on_arrays)
			return false;
		for (int i = 0; i < n && !any; i++)
		{
			JsonbValue *e = getIthJsonbValueFromContainer(arr, i);
			EgMatch		m = match_one(f, e);

			typed |= m != M_WRONG_TYPE;
			any = m == M_YES;
		}
		if (!typed)
			return false;
		return negated ? !any : any;
	}
	switch (match_one(f, &v))
	{
		case M_YES:
			return !negated;
		case M_NO:
			return negated;
		default:
			return false;
	}
}

/* Compiled filters cached across calls of one query, keyed by the filters' bytes. */
typedef struct EgFilterCache
{
	Size		len;
	char	   *bytes;
	EgFilterSet *set;
	MemoryContext cxt;
} EgFilterCache;

static EgFilterSet *
cached_filters(FunctionCallInfo fcinfo, Jsonb *filters)
{
	EgFilterCache *cache = (EgFilterCache *) fcinfo->flinfo->fn_extra;
	Size		len = VARSIZE(filters);
	MemoryContext old;

	if (cache && cache->len == len && memcmp(cache->bytes, filters, len) == 0)
		return cache->set;
	if (cache == NULL)
	{
		cache = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(EgFilterCache));
		cache->cxt = AllocSetContextCreate(fcinfo->flinfo->fn_mcxt, "eventgrid advanced filters",
										   ALLOCSET_SMALL_SIZES);
		fcinfo->flinfo->fn_extra = cache;
	}
	else
		MemoryContextReset(cache->cxt);

	/*
	 * Emptied before compiling: if compiling raises an ERROR, a later call
	 * (a PL/pgSQL block that caught the error keeps the cache) must not
	 * find a cache that claims to hold these filters.
	 */
	cache->set = NULL;
	cache->bytes = NULL;
	cache->len = 0;
	old = MemoryContextSwitchTo(cache->cxt);
	cache->bytes = palloc(len);
	memcpy(cache->bytes, filters, len);
	cache->set = compile_filters(filters);
	cache->len = len;
	MemoryContextSwitchTo(old);
	return cache->set;
}

PG_FUNCTION_INFO_V1(eventgrid_check_advanced_filters);

/*
 * SQL: eventgrid._check_advanced_filters(filters jsonb) -> boolean.  True
 * when filters is a valid Event Grid advanced filter array; otherwise raises
 * 22023 (malformed: unknown operator, missing key, wrong value type, a
 * NumberInRange value that is not a [low, high] pair, unknown field) or
 * 54000 (more than 25 filters or 25 values in all, a string value over 512
 * characters), naming the filter's 1-based position and field.
 */
Datum
eventgrid_check_advanced_filters(PG_FUNCTION_ARGS)
{
	compile_filters(PG_GETARG_JSONB_P(0));
	PG_RETURN_BOOL(true);
}

PG_FUNCTION_INFO_V1(eventgrid_advanced_match);

/*
 * SQL: eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays
 * boolean) -> boolean.  Does the event pass every filter (true when filters
 * is NULL)?  on_arrays is Event Grid's enableAdvancedFilteringOnArrays.
 */
Datum
eventgrid_advanced_match(PG_FUNCTION_ARGS)
{
	Jsonb	   *event;
	EgFilterSet *set;
	bool		on_arrays;

	if (PG_ARGISNULL(1))
		PG_RETURN_BOOL(true);
	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);
	event = PG_GETARG_JSONB_P(0);
	set = cached_filters(fcinfo, PG_GETARG_JSONB_P(1));
	on_arrays = !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);
	if (!JB_ROOT_IS_OBJECT(event))
		PG_RETURN_BOOL(false);
	for (int i = 0; i < set->nfilters; i++)
		if (!filter_passes(&event->root, &set->filters[i], on_arrays))
			PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(true);
}
