-- Advanced filters (SPEC 9): every operator matching and not matching, the
-- missing-key rules, case-insensitive strings, arrays on and off, keys in
-- either schema, and every limit on both sides.  eventgrid._advanced_match is
-- what the delivery worker's claim queries call; test 016 checks the same on
-- the wire.

-- m(filter, event, on_arrays): does the event pass the one filter?
CREATE FUNCTION m(f jsonb, e jsonb, arrays boolean DEFAULT false) RETURNS boolean
LANGUAGE sql RETURN eventgrid._advanced_match(e, jsonb_build_array(f), arrays);

CREATE TABLE cases (n serial, filter jsonb, event jsonb, arrays boolean DEFAULT false, want boolean);
INSERT INTO cases (filter, event, arrays, want) VALUES
  -- numbers
  ('{"operatorType": "NumberIn", "key": "data.n", "values": [1, 2.5, 7]}', '{"data": {"n": 2.5}}', false, true),
  ('{"operatorType": "NumberIn", "key": "data.n", "values": [1, 2.5, 7]}', '{"data": {"n": 3}}', false, false),
  ('{"operatorType": "NumberIn", "key": "data.n", "values": [1]}', '{"data": {"n": "1"}}', false, false),
  ('{"operatorType": "NumberIn", "key": "data.n", "values": [1]}', '{"data": {}}', false, false),
  ('{"operatorType": "NumberNotIn", "key": "data.n", "values": [1, 2]}', '{"data": {"n": 3}}', false, true),
  ('{"operatorType": "NumberNotIn", "key": "data.n", "values": [1, 2]}', '{"data": {"n": 2}}', false, false),
  ('{"operatorType": "NumberNotIn", "key": "data.n", "values": [1, 2]}', '{"data": {}}', false, true),
  ('{"operatorType": "NumberNotIn", "key": "data.n", "values": [1, 2]}', '{"data": {"n": "3"}}', false, false),
  ('{"operatorType": "NumberLessThan", "key": "data.n", "value": 10}', '{"data": {"n": 9.99}}', false, true),
  ('{"operatorType": "NumberLessThan", "key": "data.n", "value": 10}', '{"data": {"n": 10}}', false, false),
  ('{"operatorType": "NumberLessThan", "key": "data.n", "value": 10}', '{"data": {}}', false, false),
  ('{"operatorType": "NumberGreaterThan", "key": "data.n", "value": 10}', '{"data": {"n": 11}}', false, true),
  ('{"operatorType": "NumberGreaterThan", "key": "data.n", "value": 10}', '{"data": {"n": 10}}', false, false),
  ('{"operatorType": "NumberLessThanOrEquals", "key": "data.n", "value": 10}', '{"data": {"n": 10}}', false, true),
  ('{"operatorType": "NumberLessThanOrEquals", "key": "data.n", "value": 10}', '{"data": {"n": 10.5}}', false, false),
  ('{"operatorType": "NumberGreaterThanOrEquals", "key": "data.n", "value": -1}', '{"data": {"n": -1}}', false, true),
  ('{"operatorType": "NumberGreaterThanOrEquals", "key": "data.n", "value": -1}', '{"data": {"n": -1.5}}', false, false),
  ('{"operatorType": "NumberInRange", "key": "data.n", "values": [[0, 10], [20, 30]]}', '{"data": {"n": 20}}', false, true),
  ('{"operatorType": "NumberInRange", "key": "data.n", "values": [[0, 10], [20, 30]]}', '{"data": {"n": 15}}', false, false),
  ('{"operatorType": "NumberInRange", "key": "data.n", "values": [[0, 10]]}', '{"data": {}}', false, false),
  ('{"operatorType": "NumberNotInRange", "key": "data.n", "values": [[0, 10], [20, 30]]}', '{"data": {"n": 15}}', false, true),
  ('{"operatorType": "NumberNotInRange", "key": "data.n", "values": [[0, 10], [20, 30]]}', '{"data": {"n": 10}}', false, false),
  ('{"operatorType": "NumberNotInRange", "key": "data.n", "values": [[0, 10]]}', '{"data": {}}', false, false),
  -- booleans
  ('{"operatorType": "BoolEquals", "key": "data.ok", "value": true}', '{"data": {"ok": true}}', false, true),
  ('{"operatorType": "BoolEquals", "key": "data.ok", "value": true}', '{"data": {"ok": false}}', false, false),
  ('{"operatorType": "BoolEquals", "key": "data.ok", "value": false}', '{"data": {"ok": "false"}}', false, false),
  ('{"operatorType": "BoolEquals", "key": "data.ok", "value": false}', '{"data": {}}', false, false),
  -- strings, case-insensitive
  ('{"operatorType": "StringContains", "key": "subject", "values": ["x", "BLOB"]}', '{"subject": "/a/blobs/1"}', false, true),
  ('{"operatorType": "StringContains", "key": "subject", "values": ["x", "queue"]}', '{"subject": "/a/blobs/1"}', false, false),
  ('{"operatorType": "StringContains", "key": "subject", "values": ["a"]}', '{}', false, false),
  ('{"operatorType": "StringNotContains", "key": "subject", "values": ["x", "queue"]}', '{"subject": "/a/blobs/1"}', false, true),
  ('{"operatorType": "StringNotContains", "key": "subject", "values": ["x", "Blobs"]}', '{"subject": "/a/blobs/1"}', false, false),
  ('{"operatorType": "StringNotContains", "key": "subject", "values": ["x"]}', '{}', false, false),
  ('{"operatorType": "StringBeginsWith", "key": "subject", "values": ["/A/"]}', '{"subject": "/a/blobs/1"}', false, true),
  ('{"operatorType": "StringBeginsWith", "key": "subject", "values": ["/b/"]}', '{"subject": "/a/blobs/1"}', false, false),
  -- a value as long as the whole string, and one longer by a character
  ('{"operatorType": "StringBeginsWith", "key": "subject", "values": ["/A/Blobs/1"]}', '{"subject": "/a/blobs/1"}', false, true),
  ('{"operatorType": "StringBeginsWith", "key": "subject", "values": ["/a/blobs/12"]}', '{"subject": "/a/blobs/1"}', false, false),
  ('{"operatorType": "StringNotBeginsWith", "key": "subject", "values": ["/a/blobs/1"]}', '{"subject": "/a/blobs/1"}', false, false),
  ('{"operatorType": "StringNotBeginsWith", "key": "subject", "values": ["/b/"]}', '{"subject": "/a/blobs/1"}', false, true),
  ('{"operatorType": "StringNotBeginsWith", "key": "subject", "values": ["/b/", "/A"]}', '{"subject": "/a/blobs/1"}', false, false),
  ('{"operatorType": "StringNotBeginsWith", "key": "subject", "values": ["/b/"]}', '{}', false, false),
  ('{"operatorType": "StringEndsWith", "key": "subject", "values": [".png", ".JPG"]}', '{"subject": "cat.jpg"}', false, true),
  ('{"operatorType": "StringEndsWith", "key": "subject", "values": [".png"]}', '{"subject": "cat.jpg"}', false, false),
  ('{"operatorType": "StringEndsWith", "key": "subject", "values": ["CAT.jpg"]}', '{"subject": "cat.jpg"}', false, true),
  ('{"operatorType": "StringEndsWith", "key": "subject", "values": ["1cat.jpg"]}', '{"subject": "cat.jpg"}', false, false),
  ('{"operatorType": "StringNotEndsWith", "key": "subject", "values": [".png"]}', '{"subject": "cat.jpg"}', false, true),
  ('{"operatorType": "StringNotEndsWith", "key": "subject", "values": [".Jpg"]}', '{"subject": "cat.jpg"}', false, false),
  ('{"operatorType": "StringNotEndsWith", "key": "subject", "values": [".png"]}', '{}', false, false),
  ('{"operatorType": "StringIn", "key": "data.color", "values": ["Blue", "red"]}', '{"data": {"color": "BLUE"}}', false, true),
  ('{"operatorType": "StringIn", "key": "data.color", "values": ["Blue", "red"]}', '{"data": {"color": "blueish"}}', false, false),
  ('{"operatorType": "StringIn", "key": "data.color", "values": ["1"]}', '{"data": {"color": 1}}', false, false),
  ('{"operatorType": "StringIn", "key": "data.color", "values": ["x"]}', '{"data": {}}', false, false),
  ('{"operatorType": "StringNotIn", "key": "data.color", "values": ["Blue", "red"]}', '{"data": {"color": "green"}}', false, true),
  ('{"operatorType": "StringNotIn", "key": "data.color", "values": ["Blue", "red"]}', '{"data": {"color": "RED"}}', false, false),
  ('{"operatorType": "StringNotIn", "key": "data.color", "values": ["Blue"]}', '{"data": {}}', false, true),
  -- null and undefined
  ('{"operatorType": "IsNullOrUndefined", "key": "data.x"}', '{"data": {"x": null}}', false, true),
  ('{"operatorType": "IsNullOrUndefined", "key": "data.x"}', '{"data": {}}', false, true),
  ('{"operatorType": "IsNullOrUndefined", "key": "data.x.y"}', '{"data": {"x": 5}}', false, true),
  ('{"operatorType": "IsNullOrUndefined", "key": "data.x"}', '{"data": {"x": 0}}', false, false),
  ('{"operatorType": "IsNotNull", "key": "data.x"}', '{"data": {"x": 0}}', false, true),
  ('{"operatorType": "IsNotNull", "key": "data.x"}', '{"data": {"x": null}}', false, false),
  ('{"operatorType": "IsNotNull", "key": "data.x"}', '{"data": {}}', false, false),
  -- arrays: off, an array is a value of the wrong type; on, any element
  ('{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue", "RED"]}}', false, false),
  ('{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue", "RED"]}}', true, true),
  ('{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue"]}}', true, false),
  ('{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": []}}', true, false),
  ('{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": [1, "red"]}}', true, true),
  ('{"operatorType": "StringNotIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue", "red"]}}', true, false),
  ('{"operatorType": "StringNotIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue", "green"]}}', true, true),
  ('{"operatorType": "StringNotIn", "key": "data.tags", "values": ["red"]}', '{"data": {"tags": ["blue"]}}', false, false),
  ('{"operatorType": "NumberGreaterThan", "key": "data.n", "value": 5}', '{"data": {"n": [1, 9]}}', true, true),
  ('{"operatorType": "NumberGreaterThan", "key": "data.n", "value": 5}', '{"data": {"n": [1, 9]}}', false, false),
  ('{"operatorType": "NumberInRange", "key": "data.n", "values": [[2, 3]]}', '{"data": {"n": ["2", "3"]}}', true, false),
  ('{"operatorType": "BoolEquals", "key": "data.b", "value": true}', '{"data": {"b": [false, true]}}', true, true),
  ('{"operatorType": "IsNotNull", "key": "data.tags"}', '{"data": {"tags": []}}', false, true),
  -- keys: envelope fields under either schema's name, nested data, objects are not values
  ('{"operatorType": "StringIn", "key": "eventType", "values": ["shop.ordercreated"]}', '{"type": "Shop.OrderCreated"}', false, true),
  ('{"operatorType": "StringIn", "key": "type", "values": ["shop.ordercreated"]}', '{"eventType": "Shop.OrderCreated"}', false, true),
  ('{"operatorType": "StringBeginsWith", "key": "source", "values": ["/subscriptions/"]}', '{"topic": "/subscriptions/x"}', false, true),
  ('{"operatorType": "StringIn", "key": "dataVersion", "values": ["2.0"]}', '{"dataversion": "2.0"}', false, true),
  ('{"operatorType": "StringIn", "key": "comexampleextension1", "values": ["value1"]}', '{"comexampleextension1": "value1"}', false, true),
  ('{"operatorType": "NumberIn", "key": "data.a.b.c", "values": [3]}', '{"data": {"a": {"b": {"c": 3}}}}', false, true),
  ('{"operatorType": "StringIn", "key": "data.a", "values": ["x"]}', '{"data": {"a": {"b": "x"}}}', false, false),
  ('{"operatorType": "NumberIn", "key": "data.a.b", "values": [1]}', '{"data": {"a": [{"b": 1}]}}', true, false),
  -- operator names as ARM accepts them, in any case
  ('{"operatorType": "numberin", "key": "data.n", "values": [1]}', '{"data": {"n": 1}}', false, true);

SELECT n, filter->>'operatorType' AS operator, arrays, m(filter, event, arrays) AS got, want,
       m(filter, event, arrays) IS NOT DISTINCT FROM want AS ok
  FROM cases ORDER BY n;
SELECT count(*) AS cases, count(*) FILTER (WHERE m(filter, event, arrays) IS DISTINCT FROM want) AS wrong FROM cases;

-- filters are AND'ed; no filters (NULL) pass everything
SELECT eventgrid._advanced_match('{"data": {"n": 5, "c": "red"}}',
         '[{"operatorType": "NumberIn", "key": "data.n", "values": [5]},
           {"operatorType": "StringIn", "key": "data.c", "values": ["red"]}]', false) AS both_match,
       eventgrid._advanced_match('{"data": {"n": 5, "c": "blue"}}',
         '[{"operatorType": "NumberIn", "key": "data.n", "values": [5]},
           {"operatorType": "StringIn", "key": "data.c", "values": ["red"]}]', false) AS one_fails,
       eventgrid._advanced_match('{"data": {}}', NULL, false) AS no_filters;

-- Checks and limits, each on both sides
-- err() comes from the config test
CREATE FUNCTION chk(f jsonb) RETURNS text LANGUAGE sql
RETURN err(format('SELECT eventgrid._check_advanced_filters(%L)', f));
-- n filters of the given kind
CREATE FUNCTION many(n int, f jsonb) RETURNS jsonb LANGUAGE sql
RETURN (SELECT jsonb_agg(f) FROM generate_series(1, n));

SELECT chk(many(25, '{"operatorType": "IsNotNull", "key": "data.a"}')) AS filters_25;
SELECT chk(many(26, '{"operatorType": "IsNotNull", "key": "data.a"}')) AS filters_26;
SELECT chk(many(25, '{"operatorType": "NumberLessThan", "key": "data.a", "value": 1}')) AS values_25_singles;
SELECT chk(many(5, '{"operatorType": "NumberIn", "key": "data.a", "values": [1, 2, 3, 4, 5]}')) AS values_25_lists;
SELECT chk(many(5, '{"operatorType": "NumberIn", "key": "data.a", "values": [1, 2, 3, 4, 5]}')
           || '[{"operatorType": "BoolEquals", "key": "data.b", "value": true}]') AS values_26;
SELECT chk(jsonb_build_array(jsonb_build_object('operatorType', 'StringIn', 'key', 'data.a',
           'values', jsonb_build_array(repeat('x', 512))))) AS string_512;
SELECT chk(jsonb_build_array(jsonb_build_object('operatorType', 'StringIn', 'key', 'data.a',
           'values', jsonb_build_array('ok', repeat('x', 513))))) AS string_513;
SELECT chk('[]') AS empty_array;
SELECT chk('{"operatorType": "IsNotNull", "key": "a"}') AS not_an_array;
SELECT chk('[5]') AS not_an_object;
SELECT chk('[{"operatorType": "NumberBetween", "key": "a", "values": [1]}]') AS unknown_operator;
SELECT chk('[{"key": "a", "values": [1]}]') AS no_operator;
SELECT chk('[{"operatorType": "NumberIn", "values": [1]}]') AS missing_key;
SELECT chk('[{"operatorType": "NumberIn", "key": "", "values": [1]}]') AS empty_key;
SELECT chk('[{"operatorType": "NumberIn", "key": "data..a", "values": [1]}]') AS empty_key_part;
SELECT chk('[{"operatorType": "NumberIn", "key": 5, "values": [1]}]') AS key_not_string;
SELECT chk('[{"operatorType": "NumberIn", "key": "a", "values": ["1"]}]') AS number_as_string;
SELECT chk('[{"operatorType": "NumberIn", "key": "a", "values": []}]') AS no_values;
SELECT chk('[{"operatorType": "NumberIn", "key": "a", "value": 1}]') AS value_for_values;
SELECT chk('[{"operatorType": "NumberLessThan", "key": "a", "values": [1]}]') AS values_for_value;
SELECT chk('[{"operatorType": "NumberLessThan", "key": "a", "value": "1"}]') AS value_not_number;
SELECT chk('[{"operatorType": "BoolEquals", "key": "a", "value": "true"}]') AS bool_as_string;
SELECT chk('[{"operatorType": "StringIn", "key": "a", "values": [1]}]') AS string_as_number;
SELECT chk('[{"operatorType": "StringIn", "key": "a", "values": "x"}]') AS values_not_array;
SELECT chk('[{"operatorType": "NumberInRange", "key": "a", "values": [[1, 2, 3]]}]') AS range_of_three;
SELECT chk('[{"operatorType": "NumberInRange", "key": "a", "values": [1, 2]}]') AS range_flat;
SELECT chk('[{"operatorType": "NumberNotInRange", "key": "a", "values": [[3, 2]]}]') AS range_reversed;
SELECT chk('[{"operatorType": "NumberInRange", "key": "a", "values": [[2, 2]]}]') AS range_single_point;
SELECT chk('[{"operatorType": "IsNullOrUndefined", "key": "a", "value": 1}]') AS null_check_with_value;
SELECT chk('[{"operatorType": "StringIn", "key": "a", "values": ["x"], "valuse": ["y"]}]') AS unknown_field;
SELECT chk('[{"operatorType": "IsNotNull", "key": "a"}, {"operatorType": "StringIn", "key": "b", "values": [null]}]') AS second_filter;

-- Filters that fail to compile leave no cache behind: within one PL/pgSQL
-- loop that catches the error, the same filters again are refused again,
-- not taken for the filters of the same size compiled before.  (PL/pgSQL
-- prepares an expression anew after an error in it, so no SQL path reuses
-- that cache today; the cache is emptied before compiling all the same.)
SELECT pg_column_size('[{"operatorType": "NumberIn", "key": "data.n", "values": [1]}]'::jsonb)
     = pg_column_size('[{"operatorType": "NumberXx", "key": "data.n", "values": [1]}]'::jsonb) AS same_size;
DO $$
DECLARE
    f jsonb;
BEGIN
    FOREACH f IN ARRAY ARRAY['[{"operatorType": "NumberIn", "key": "data.n", "values": [1]}]',
                             '[{"operatorType": "NumberXx", "key": "data.n", "values": [1]}]',
                             '[{"operatorType": "NumberXx", "key": "data.n", "values": [1]}]']::jsonb[] LOOP
        BEGIN
            RAISE NOTICE 'matches: %', eventgrid._advanced_match('{"data": {"n": 1}}', f, false);
        EXCEPTION WHEN invalid_parameter_value THEN
            RAISE NOTICE 'refused: %', SQLERRM;
        END;
    END LOOP;
END $$;

-- Keys match whatever their case, as Event Grid's own examples write them
-- (Data.color and data.color); an exact key is preferred
SELECT m('{"operatorType": "StringIn", "key": "SUBJECT", "values": ["/a/b"]}',
         '{"id": "7", "subject": "/a/b", "eventType": "T.x", "data": {"SubObject": {"ID": 3}, "color": "red"}}') AS upper_subject,
       m('{"operatorType": "StringIn", "key": "Id", "values": ["7"]}',
         '{"id": "7", "subject": "/a/b", "eventType": "T.x", "data": {}}') AS capital_id,
       m('{"operatorType": "StringIn", "key": "EventType", "values": ["T.x"]}',
         '{"id": "7", "subject": "/a/b", "eventType": "T.x", "data": {}}') AS capital_event_type,
       m('{"operatorType": "NumberIn", "key": "DATA.subobject.id", "values": [3]}',
         '{"id": "7", "subject": "/a/b", "eventType": "T.x", "data": {"SubObject": {"ID": 3}}}') AS nested_any_case,
       m('{"operatorType": "StringIn", "key": "TYPE", "values": ["T.y"]}',
         '{"specversion": "1.0", "id": "7", "source": "s", "type": "T.y", "data": {}}') AS cloudevents_type,
       m('{"operatorType": "StringIn", "key": "EventType", "values": ["T.y"]}',
         '{"specversion": "1.0", "id": "7", "source": "s", "type": "T.y", "data": {}}') AS alias_any_case,
       m('{"operatorType": "StringIn", "key": "data.Color", "values": ["blue"]}',
         '{"data": {"color": "red", "Color": "blue"}}') AS exact_first,
       m('{"operatorType": "IsNullOrUndefined", "key": "data.COLOUR"}',
         '{"data": {"color": "red"}}') AS other_name_missing;

DROP FUNCTION m(jsonb, jsonb, boolean);
DROP FUNCTION chk(jsonb);
DROP FUNCTION many(integer, jsonb);
DROP TABLE cases;

