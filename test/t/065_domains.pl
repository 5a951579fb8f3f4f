# Event domains (SPEC 18), against a real receiver:
#   - create_domain() / drop_domain() / create_domain_topic() /
#     drop_domain_topic(); domains and topics share their names; a domain
#     takes Event Grid schema or CloudEvents events, not custom ones;
#   - publishing to a domain routes each event by its "topic" (Event Grid
#     schema) or "source" (CloudEvents): subscriptions at domain scope get
#     every domain topic's events, at domain-topic scope ('domain/topic')
#     only theirs, with filters, batching, ordering, custom headers and
#     dead letters; an event naming a domain topic that does not exist
#     reaches the domain-scope subscriptions only; an event that names none
#     refuses the whole statement (22023, naming its position);
#   - a delivered Event Grid event's topic is its domain topic's path; a
#     CloudEvent keeps its source;
#   - auto-create with the first subscription and auto-delete with the last
#     (both on by default; off: 42704), also when the last one expires;
#     subscription names unique per domain topic; the per-subscription
#     functions take 'domain/topic';
#   - a domain topic's subscription reads its events through the index on
#     (topic, domain_topic, txid, id);
#   - views domain_topics and domain_statistics, delivery_statistics'
#     domain_topic; the roles.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json encode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('domains', 'eventgrid.delivery_workers' => 2);
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }

# the events that arrived at $path: "id" (sorted), from their JSON bodies
sub arrived
{
	my ($path, $field) = @_;
	$field //= 'id';
	return join(',', sort map { $_->{$field} // '(none)' } map {
		my $b = decode_json($_->{body});
		ref $b eq 'ARRAY' ? @$b : ($b)
	} requests($r, $path));
}

sub eg
{
	my ($id, $topic, %extra) = @_;
	return encode_json({ id => $id, subject => "/orders/$id", eventType => 'Shop.OrderCreated',
		eventTime => '2024-05-01T12:00:00Z', data => { orderId => $id }, (defined $topic ? (topic => $topic) : ()), %extra });
}

sub ce
{
	my ($id, $source) = @_;
	return encode_json({ specversion => '1.0', id => $id, source => $source, type => 'Shop.Order' });
}

sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher; CREATE ROLE nobody LOGIN");

# --- domains and their names ----------------------------------------------------
sql("SET ROLE ops; SELECT eventgrid.create_domain('saas')");
sql("SELECT eventgrid.create_topic('plain')");
like(fails("SELECT eventgrid.create_domain('plain')"), qr/42710/, 'a domain cannot take a topic\'s name');
like(fails("SELECT eventgrid.create_topic('saas')"), qr/42710/, 'nor a topic a domain\'s');
like(fails("SELECT eventgrid.create_domain('saas')"), qr/42710.*domain "saas" already exists/s, 'a domain exists once');
like(fails("SELECT eventgrid.create_domain('bad/name')"), qr/42602/, 'a domain name is a topic name');
like(fails("SELECT eventgrid.create_domain('custom-d', 'CustomEventSchema')"), qr/22023.*not CustomEventSchema/s,
	'a domain does not take custom events');
like(fails("SELECT eventgrid.drop_topic('saas')"), qr/42809.*is a domain, not a topic.*drop_domain/s,
	'drop_topic() refuses a domain');
sql("CREATE TABLE orders (id int PRIMARY KEY)");
like(fails("SELECT eventgrid.publish_table_changes('orders', 'saas')"), qr/42809.*is an event domain: table changes are published to a topic/s,
	'table changes are not published to a domain (they name no domain topic)');
like(fails("SELECT eventgrid.create_domain('other')", 'nobody'), qr/42501/, 'a role without eventgrid_admin creates no domain');
like(fails("SELECT eventgrid.create_domain_topic('saas', 'x1')", 'app'), qr/42501/, 'nor a publisher a domain topic');

# --- subscriptions at both scopes ------------------------------------------------
sql("SELECT eventgrid.create_event_subscription('saas', 'ops', '$u/status/200/ops')");
sql("SET ROLE ops; SELECT eventgrid.create_event_subscription('saas/tenant-a', 'hook', '$u/status/200/a')");
sql("SELECT eventgrid.create_event_subscription('saas/tenant-b', 'hook', '$u/status/200/b')");
sql("SELECT eventgrid.create_event_subscription('saas/tenant-b', 'shipped', '$u/status/200/b-shipped', "
	  . "included_event_types => ARRAY['Shop.OrderShipped'])");
sql("SELECT eventgrid.create_event_subscription('saas/tenant-a', 'ordered', '$u/status/200/a-ordered', "
	  . "ordering_key => 'data.orderId', max_events_per_batch => 10)");
sql("SELECT eventgrid.set_delivery_property('saas/tenant-a', 'hook', 'X-Tenant', 'tenant-a')");
like(fails("SELECT eventgrid.create_event_subscription('saas/tenant-a', 'hook', '$u/status/200/a2')"),
	qr/42710.*already exists for topic "saas\/tenant-a"/s, 'names are unique per domain topic');
like(fails("SELECT eventgrid.create_event_subscription('plain/x1', 'hook', '$u/status/200/x')"),
	qr/42704.*plain.*is not a domain/s, "'topic/name' needs a domain");
like(fails("SELECT eventgrid.create_event_subscription('plain', 'dl-sub', '$u/status/200/x', dead_letter_topic => 'saas')"),
	qr/22023.*dead_letter_topic "saas" is an event domain/s, 'a domain takes no dead-letter notifications (they name no domain topic)');
like(fails("SELECT eventgrid.create_event_subscription('saas/no good', 'hook', '$u/status/200/x')"),
	qr/42602.*invalid domain topic name/s, 'a domain topic name is checked');
is(sql("SELECT string_agg(domain || '/' || domain_topic || ':' || subscriptions || ':' || created_automatically, ' ' "
		  . "ORDER BY domain_topic) FROM eventgrid.domain_topics"),
	'saas/tenant-a:2:true saas/tenant-b:2:true', 'the first subscriptions created their domain topics (domain_topics)');
is(sql("SELECT string_agg(subscription || ':' || coalesce(domain_topic, '-'), ' ' ORDER BY subscription, domain_topic) "
		  . "FROM eventgrid.delivery_statistics WHERE topic = 'saas'"),
	'hook:tenant-a hook:tenant-b ops:- ordered:tenant-a shipped:tenant-b', 'delivery_statistics names the domain topic');
is(sql("SELECT string_agg(topic || ':' || event_subscription, ' ' ORDER BY topic || ':' || event_subscription COLLATE \"C\") "
		  . "FROM eventgrid.event_subscription_metrics WHERE topic LIKE 'saas%'"),
	'saas/tenant-a:hook saas/tenant-a:ordered saas/tenant-b:hook saas/tenant-b:shipped saas:ops',
	'the metrics name a domain topic\'s subscriptions by domain/topic (one series each, same names or not)');

# --- routing ------------------------------------------------------------------------
my $before = sql("SELECT count(*) FROM eventgrid.events");
like(fails("SELECT eventgrid.publish('saas', '[" . eg('ok-1', 'tenant-a') . ',' . eg('no-topic', undef) . "]')", 'app'),
	qr/22023.*event 2 of the statement names no domain topic of domain "saas"/s,
	'an event without a domain topic refuses the statement, naming its position');
like(fails("INSERT INTO eventgrid.events (topic, event) VALUES ('saas', '" . eg('e1', 'tenant-a') . "'), ('saas', '"
		  . eg('e2', '') . "')", 'app'), qr/22023.*event 2 of the statement names no domain topic/s, '(an INSERT too)');
is(sql("SELECT count(*) FROM eventgrid.events"), $before, 'nothing of either statement was published');

sql("SET ROLE app; SELECT eventgrid.publish('saas', '["
	  . join(',', eg('a-1', 'tenant-a', data => { orderId => 'o1' }), eg('a-2', 'tenant-a', data => { orderId => 'o1' }),
		eg('b-1', 'tenant-b'), eg('b-2', 'tenant-b', eventType => 'Shop.OrderShipped'),
		eg('z-1', 'tenant-zzz'), eg('p-1', '/domains/saas/topics/tenant-a', data => { orderId => 'o1' })) . "]')");
sql("SET ROLE app; INSERT INTO eventgrid.events (topic, event) VALUES ('saas', '" . eg('b-3', 'tenant-b') . "')");
wait_for_requests($r, '/status/200/ops', 7);
wait_for_requests($r, '/status/200/b', 3);
wait_for_requests($r, '/status/200/a', 3);
ok(wait_for_sql($node, "SELECT sum(pending) FROM eventgrid.delivery_statistics WHERE topic = 'saas'", '0'), 'all delivered');
is(arrived('/status/200/ops'), 'a-1,a-2,b-1,b-2,b-3,p-1,z-1', 'domain scope: every domain topic\'s events');
is(arrived('/status/200/a'), 'a-1,a-2,p-1', 'domain topic tenant-a: its events only (also named by path)');
is(arrived('/status/200/b'), 'b-1,b-2,b-3', 'domain topic tenant-b: its events only');
is(arrived('/status/200/b-shipped'), 'b-2', 'with its filters');
is(join(',', map { $_->{id} } map { @{ decode_json($_->{body}) } } requests($r, '/status/200/a-ordered')), 'a-1,a-2,p-1',
	'an ordered, batched subscription of a domain topic gets its events in order');
is(arrived('/status/200/a', 'topic'), join(',', ('/domains/saas/topics/tenant-a') x 3),
	'a delivered event\'s topic is its domain topic\'s path');
is(arrived('/status/200/ops', 'topic'), join(',', sort map { "/domains/saas/topics/$_" }
	qw(tenant-a tenant-a tenant-b tenant-b tenant-b tenant-a tenant-zzz)), '(at domain scope too)');
ok(!(grep { ($_->{headers}{'x-tenant'} // '') ne 'tenant-a' } requests($r, '/status/200/a')), 'with its delivery property');
is(sql("SELECT count(*) FROM eventgrid.events WHERE domain_topic = 'tenant-zzz'"), '1',
	'an event naming a domain topic that does not exist is kept (it reached the domain scope only)');
is(sql("SELECT count(*) FROM eventgrid.domain_topics WHERE domain_topic = 'tenant-zzz'"), '0', 'publishing creates no domain topic');

# a domain topic's subscription reads through the index, not the domain's events
my $plan = sql("SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT * FROM eventgrid._unpassed_events('saas/tenant-a', pg_current_snapshot(), NULL, '0', 0)");
like($plan, qr/events_\d_expr_txid_id_idx/, 'a domain topic\'s events are read through its read key\'s index (topic || \'/\' || domain_topic, txid, id)');

# --- the per-subscription functions take 'domain/topic' --------------------------
sql("SELECT eventgrid.pause_delivery('saas/tenant-a', 'hook')");
is(sql("SELECT paused FROM eventgrid.delivery_statistics WHERE topic = 'saas' AND domain_topic = 'tenant-a' AND subscription = 'hook'"),
	't', 'pause_delivery() pauses the domain topic\'s subscription');
is(sql("SELECT count(*) FILTER (WHERE paused) FROM eventgrid.delivery_statistics WHERE topic = 'saas'"), '1', 'only it');
sql("SELECT eventgrid.update_event_subscription('saas/tenant-a', 'hook', endpoint => '$u/status/200/a-new')");
sql("SELECT eventgrid.resume_delivery('saas/tenant-a', 'hook')");
sql("SET ROLE app; SELECT eventgrid.publish('saas', '" . eg('a-3', 'tenant-a') . "')");
wait_for_requests($r, '/status/200/a-new', 1);
is(arrived('/status/200/a-new'), 'a-3', 'update_event_subscription() moved it to its new endpoint');

# --- CloudEvents, a domain that does not create its topics -----------------------
sql("SELECT eventgrid.create_domain('saas-ce', 'CloudEventSchemaV1_0', auto_create_topic_with_first_subscription => false, "
	  . "auto_delete_topic_with_last_subscription => false)");
like(fails("SELECT eventgrid.create_event_subscription('saas-ce/ten-1', 'hook', '$u/status/200/ce1')"),
	qr/42704.*domain topic "ten-1" of domain "saas-ce" does not exist/s, 'auto-create off: the domain topic must exist (42704)');
sql("SELECT eventgrid.create_domain_topic('saas-ce', 'ten-1')");
like(fails("SELECT eventgrid.create_domain_topic('saas-ce', 'ten-1')"), qr/42710/, 'a domain topic exists once');
like(fails("SELECT eventgrid.create_domain_topic('nope', 'ten-1')"), qr/42704.*domain "nope" does not exist/s, 'no such domain');
sql("SELECT eventgrid.create_event_subscription('saas-ce/ten-1', 'hook', '$u/status/200/ce1')");
sql("SELECT eventgrid.create_event_subscription('saas-ce', 'all', '$u/status/200/ce-all')");
sql("SET ROLE app; SELECT eventgrid.publish('saas-ce', '[" . join(',', ce('c-1', 'ten-1'), ce('c-2', 'ten-2'), ce('c-3', 'ten-1')) . "]')");
wait_for_requests($r, '/status/200/ce-all', 3);
wait_for_requests($r, '/status/200/ce1', 2);
ok(wait_for_sql($node, "SELECT sum(pending) FROM eventgrid.delivery_statistics WHERE topic = 'saas-ce'", '0'), 'delivered');
is(arrived('/status/200/ce1'), 'c-1,c-3', 'CloudEvents are routed by source');
is(arrived('/status/200/ce1', 'source'), 'ten-1,ten-1', 'a CloudEvent keeps its source');
is(arrived('/status/200/ce-all'), 'c-1,c-2,c-3', 'domain scope gets them all');
sql("SELECT eventgrid.drop_event_subscription('saas-ce/ten-1', 'hook')");
is(sql("SELECT count(*) FROM eventgrid.domain_topics WHERE domain = 'saas-ce'"), '1', 'auto-delete off: the domain topic stays');
is(sql("SELECT domain || ':' || domain_topics || ':' || domain_scope_subscriptions || ':' || domain_topic_subscriptions "
		  . "|| ':' || auto_create_topic_with_first_subscription FROM eventgrid.domain_statistics ORDER BY domain"),
	"saas:2:1:4:true\nsaas-ce:1:1:0:false", 'domain_statistics counts domain topics and subscriptions');

# --- unmatched events of a domain: only a subscription of the event's own
# domain topic, or of the whole domain, takes it
sql("SELECT eventgrid.create_domain('solo')");
sql("SELECT eventgrid.create_event_subscription('solo/top-1', 'hook', '$u/status/200/solo-t1')");
sql("SELECT eventgrid.create_event_subscription('solo/top-3', 'shipped', '$u/status/200/solo-t3', "
	  . "included_event_types => ARRAY['Shop.OrderShipped'])");
sql("SET ROLE app; SELECT eventgrid.publish('solo', '[" . join(',', eg('s-1', 'top-1'), eg('s-2', 'top-2'), eg('s-3', 'top-3'), eg('s-4', 'top-1')) . "]')");
wait_for_requests($r, '/status/200/solo-t1', 2);
ok(wait_for_sql($node, "SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'solo'", '2'),
	'an event for a domain topic without a subscription, and one its subscription filters out, are unmatched; top-1\'s are not')
	or diag(sql("SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'solo'"));
sql("SELECT eventgrid.create_event_subscription('solo', 'all', '$u/status/200/solo-all')");
sql("SET ROLE app; SELECT eventgrid.publish('solo', '[" . join(',', eg('s-5', 'top-2'), eg('s-6', 'top-3')) . "]')");
wait_for_requests($r, '/status/200/solo-all', 2);
ok(wait_for_sql($node, "SELECT publish_success_total FROM eventgrid.topic_metrics WHERE topic = 'solo'", '6'), 'six counted as published');
is(sql("SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'solo'"), '2',
	'with a subscription of the whole domain, nothing more is unmatched');
sql("SELECT eventgrid.drop_domain('solo')");

# --- auto-delete, drop_domain_topic, expiration; dead letters kept -----------------
sql("SELECT eventgrid.drop_event_subscription('saas/tenant-b', 'shipped')");
is(sql("SELECT subscriptions FROM eventgrid.domain_topics WHERE domain_topic = 'tenant-b'"), '1', 'one subscription left');
sql("SELECT eventgrid.drop_event_subscription('saas/tenant-b', 'hook')");
is(sql("SELECT count(*) FROM eventgrid.domain_topics WHERE domain_topic = 'tenant-b'"), '0',
	'the last subscription took its domain topic along (auto-delete)');
sql("SELECT eventgrid.create_event_subscription('saas/tenant-c', 'refusing', '$u/status/400/c', deadletter => true)");
sql("SET ROLE app; SELECT eventgrid.publish('saas', '" . eg('c-1', 'tenant-c') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'refusing'", '1'),
	'a domain topic\'s subscription dead-letters');
sql("SELECT eventgrid.drop_domain_topic('saas', 'tenant-c')");
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE domain_topic = 'tenant-c'")
	  . sql("SELECT count(*) FROM eventgrid.domain_topics WHERE domain_topic = 'tenant-c'"), '00',
	'drop_domain_topic() dropped it and its subscriptions');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'refusing'"), '1', 'its dead letters are kept');
like(fails("SELECT eventgrid.drop_domain_topic('saas', 'tenant-c')"), qr/42704/, 'it is gone');
sql("SELECT eventgrid.create_event_subscription('saas/tenant-t', 'trial', '$u/status/200/t', "
	  . "expiration_time => clock_timestamp() + interval '2 seconds')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.domain_topics WHERE domain_topic = 'tenant-t'", '0', 30),
	'an expired last subscription takes its domain topic along');

# --- a tenant's own role: its domain topic's subscriptions only (README "Event domains") ---
sql(q{CREATE ROLE acme LOGIN; CREATE ROLE globex LOGIN;
CREATE SCHEMA tenancy AUTHORIZATION ops; GRANT USAGE ON SCHEMA tenancy TO acme, globex;
CREATE TABLE tenancy.tenant_roles (role_name name PRIMARY KEY, domain_topic text NOT NULL);
INSERT INTO tenancy.tenant_roles VALUES ('acme', 'tenant-acme'), ('globex', 'tenant-globex');
ALTER TABLE tenancy.tenant_roles OWNER TO ops;
SET ROLE ops;
CREATE FUNCTION tenancy.tenant_subscribe(name text, endpoint text) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN eventgrid.create_event_subscription(
        'saas/' || (SELECT t.domain_topic FROM tenancy.tenant_roles t WHERE t.role_name = session_user), name, endpoint);
REVOKE ALL ON FUNCTION tenancy.tenant_subscribe(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tenancy.tenant_subscribe(text, text) TO acme, globex;});
$node->safe_psql('postgres', "SELECT tenancy.tenant_subscribe('acme-hook', '$u/status/200/acme')", extra_params => [ '-U', 'acme' ]);
is(sql("SELECT domain_topic FROM eventgrid.event_subscriptions WHERE name = 'acme-hook'"), 'tenant-acme',
	'a tenant\'s role subscribes its own domain topic through the admin\'s wrapper');
my ($rc, $o, $err) = $node->psql('postgres', "SELECT eventgrid.create_event_subscription('saas/tenant-globex', 'steal', '$u/x')",
	extra_params => [ '-U', 'acme' ]);
like($err, qr/permission denied for function create_event_subscription/, 'and nothing else: not another tenant\'s topic');

# --- drop_domain ---------------------------------------------------------------------
sql("SET ROLE ops; SELECT eventgrid.drop_domain('saas')");
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic = 'saas'") . ':'
	  . sql("SELECT count(*) FROM eventgrid.domain_topics WHERE domain = 'saas'") . ':'
	  . sql("SELECT count(*) FROM eventgrid.topics WHERE name = 'saas'"), '0:0:0',
	'drop_domain() dropped its subscriptions, domain topics and name');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_events WHERE topic = 'saas'"), '1', 'dead letters are kept');
like(fails("SELECT eventgrid.drop_domain('plain')"), qr/42704.*domain "plain" does not exist/s, 'drop_domain() takes only domains');
sql("SELECT eventgrid.create_topic('saas')");
is(sql("SELECT count(*) FROM eventgrid.topics WHERE name = 'saas'"), '1', 'its name is free again');

done_testing();
