# A hostile tenant against eventgrid (issue "Trust", items 1 and 2).
#
# 1. A non-superuser database owner plants functions and operators in the
#    public schema that shadow built-ins (to_jsonb(text), *(bigint,
#    interval), cardinality(text[]), lower(text), =(text, text), ...) and
#    puts public first in the database's search_path.  Neither the delivery
#    worker nor any eventgrid function, called by a superuser, may run them.
# 2. Event fields that become headers cannot inject headers or smuggle a
#    request: publishing refuses them, and the request builder refuses a
#    header line with a control character even for a row that bypassed the
#    publish trigger (the delivery fails with outcome InvalidHeader and
#    nothing is sent).  Dynamic delivery properties with control characters
#    are left out.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('hostile');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

# trusted statements pin their own search_path
sub sql { return $node->safe_psql('postgres', 'SET search_path = pg_catalog; ' . shift) }
# API calls made as a superuser would, with the database's (hostile) search_path
sub api { return $node->safe_psql('postgres', shift) }

$node->safe_psql('postgres', q{
CREATE ROLE mallory LOGIN;
ALTER DATABASE postgres OWNER TO mallory;
});
$node->safe_psql('postgres', q{
SET ROLE mallory;
CREATE TABLE public.pwned (app text, fn text, usr text, at timestamptz DEFAULT pg_catalog.now());
GRANT ALL ON public.pwned TO PUBLIC;
CREATE FUNCTION public.note(fn text) RETURNS void LANGUAGE sql SET search_path = pg_catalog
  AS $$ INSERT INTO public.pwned (app, fn, usr) VALUES (current_setting('application_name'), fn, current_user) $$;
CREATE FUNCTION public.to_jsonb(v text) RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('to_jsonb'); RETURN pg_catalog.to_jsonb(v); END $$;
CREATE FUNCTION public.cardinality(v text[]) RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('cardinality'); RETURN pg_catalog.cardinality(v); END $$;
CREATE FUNCTION public.lower(v text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('lower'); RETURN pg_catalog.lower(v); END $$;
CREATE FUNCTION public.left(v text, n integer) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('left'); RETURN pg_catalog.left(v, n); END $$;
CREATE FUNCTION public.starts_with(a text, b text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('starts_with'); RETURN pg_catalog.starts_with(a, b); END $$;
CREATE FUNCTION public.jsonb_typeof(a jsonb) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('jsonb_typeof'); RETURN pg_catalog.jsonb_typeof(a); END $$;
CREATE FUNCTION public.mul(a bigint, b interval) RETURNS interval LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('*(bigint,interval)'); RETURN b OPERATOR(pg_catalog.*) a::float8; END $$;
CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.mul);
CREATE FUNCTION public.teq(a text, b text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('=(text,text)'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.teq);
CREATE FUNCTION public.tle(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog
  AS $$ BEGIN PERFORM public.note('<=(timestamptz,timestamptz)'); RETURN a OPERATOR(pg_catalog.<=) b; END $$;
CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.tle);
ALTER DATABASE postgres SET search_path = public, pg_catalog;
});

# the planted objects work: an unqualified call from a session reaches them
$node->safe_psql('postgres', "SET application_name = 'sanity'; SELECT lower('X')");
is(sql("SELECT count(*) FROM public.pwned WHERE app = 'sanity'"), '1',
	'sanity: a planted function shadows the built-in for sessions with the database search_path');

# the workers connect again, so they see the database's new search_path
ok(restart_workers($node), 'the workers restarted');

# every API function, called by a superuser with the hostile search_path
api("SELECT eventgrid.create_topic('shop')");
api("SELECT eventgrid.create_topic('cloud', 'CloudEventSchemaV1_0')");
api("SELECT eventgrid.create_event_subscription('shop', 'good', '$u/status/200/good', included_event_types => ARRAY['Shop.OrderCreated'], subject_begins_with => '/orders', subject_ends_with => '', max_events_per_batch => 5)");
api("SELECT eventgrid.create_event_subscription('shop', 'bad', '$u/status/500/bad', max_delivery_attempts => 1, deadletter => true, event_delivery_schema => 'CloudEventSchemaV1_0')");
api("SELECT eventgrid.create_event_subscription('cloud', 'cev', '$u/status/200/ce', event_delivery_schema => 'EventGridSchema')");
api("SELECT eventgrid.set_retry_policy('shop', 'good', 5, 60)");
api("SELECT eventgrid.set_batching('shop', 'good', 10, 64)");
api("SELECT eventgrid.set_deadletter('shop', 'good', true)");
api("SELECT eventgrid.set_delivery_property('shop', 'good', 'X-Secret', 's3cret', true)");
api("SELECT eventgrid.set_dynamic_delivery_property('shop', 'good', 'X-Order', 'data.orderId')");
api("SELECT eventgrid.remove_delivery_property('shop', 'good', 'X-Secret')");
api("SELECT eventgrid.publish('shop', '[" . eg_event('h-1') . "," . eg_event('h-2') . "]')");
api("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('h-3') . "')");
api(q{SELECT eventgrid.publish('cloud', '{"id": "c-1", "source": "/s", "specversion": "1.0", "type": "T", "data": {"a": 1}}')});
is(scalar(wait_for_requests($r, '/status/200/good', 1, 30)) >= 1, 1, 'events delivered to the good subscription');
wait_for_requests($r, '/status/200/ce', 1, 30);
ok(wait_for_sql($node, "SET search_path = pg_catalog; SELECT count(*) FROM eventgrid.dead_letters", '3', 30),
	'events dead-lettered for the failing subscription');
api("SELECT eventgrid.retry_delay(3, 503), eventgrid.delivery_outcome(404), eventgrid.rfc3339(now())");
api("SELECT count(*) FROM eventgrid.dead_letter_events");
api("SELECT count(*) FROM eventgrid.delivery_statistics");
api("SELECT count(*) FROM eventgrid.topic_statistics");
api("SELECT count(*) FROM eventgrid.event_subscription_delivery_properties");
api("SELECT eventgrid.drop_event_subscription('shop', 'bad')");
api("SELECT eventgrid.drop_topic('cloud')");

is(sql("SELECT coalesce(string_agg(DISTINCT app || ': ' || fn || ' as ' || usr, ', '), 'none') FROM public.pwned WHERE app <> 'sanity'"),
	'none', 'no planted function or operator ran, in the worker or in eventgrid functions');

# --- 2. header injection and request smuggling
$node->safe_psql('postgres', 'ALTER DATABASE postgres RESET search_path');
api("SELECT eventgrid.create_event_subscription('shop', 'hdr', '$u/status/200/hdr', deadletter => true)");
my ($ret, $out, $err) = $node->psql('postgres',
	q{SELECT eventgrid.publish('shop', jsonb_build_object('id', E'x\r\nContent-Length: 0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a', 'subject', '/orders/s', 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z'))});
like($err, qr/event field "id" must not contain control characters/, 'a smuggling id is refused at publish (22023)');

# second line of defence: a row that bypassed the publish trigger
my $before = scalar(requests($r, '/status/200/hdr'));
api(q{ALTER TABLE eventgrid.events DISABLE TRIGGER events_validate;
INSERT INTO eventgrid.events (topic, event, publish_time) VALUES
  ('shop', jsonb_build_object('id', E'bad\r\nInjected: yes', 'subject', '/orders/x', 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z', 'dataVersion', ''), now());
ALTER TABLE eventgrid.events ENABLE TRIGGER events_validate;});
api(q{INSERT INTO eventgrid.events (topic, event) VALUES ('shop', jsonb_build_object('id', 'dyn-1', 'subject', '/orders/d', 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('orderId', E'7\r\nInjected: yes')))});
api(q{SELECT eventgrid.set_dynamic_delivery_property('shop', 'hdr', 'X-Order', 'data.orderId')});
api(q{INSERT INTO eventgrid.events (topic, event) VALUES ('shop', jsonb_build_object('id', 'dyn-2', 'subject', '/orders/d', 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('orderId', E'7\u000b8')))});
ok(wait_for_sql($node, "SELECT dead_letter_reason || '/' || last_delivery_outcome || '/' || delivery_attempts FROM eventgrid.dead_letters WHERE subscription_name = 'hdr'",
	'NonRetriableError/InvalidHeader/0', 30),
	'a header line with a control character is not sent: dead-lettered with outcome InvalidHeader, no attempt counted');
my @hdr = wait_for_requests($r, '/status/200/hdr', 2, 30);
my @ids = sort map { $json->decode($_->{body})->[0]{id} } @hdr;
is_deeply(\@ids, [ 'dyn-1', 'dyn-2' ], 'only the two clean events reached the receiver, one request each');
ok(!(grep { exists $_->{headers}{injected} || exists $_->{headers}{'x-order'} } @hdr),
	'no injected header arrived; dynamic values with control characters are left out');
like(slurp_file($node->logfile), qr/was not sent: a header value holds a control character/,
	'the refused request is logged');

$node->stop;
done_testing();
