# What a session keeps of a table change publication cannot go stale
# (issue "Trust, third pass", item 2): a session whose look at the
# publication happens inside a REPEATABLE READ or SERIALIZABLE transaction
# begun before another session changed the publication (itself in a
# REPEATABLE READ or SERIALIZABLE transaction) publishes by the publication
# as it stands, in that statement and in every later one: a column removed is
# not published again, a column added back is.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# (the events are read back from the event tables: no rotation empties them meanwhile)
my $node = new_node('publication_snapshots', 'eventgrid.event_table_rotation' => "'1h'");
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('snap')");
sql("CREATE TABLE snap_t (id int PRIMARY KEY, a int, b text)");
sql("SELECT eventgrid.publish_table_changes('snap_t', 'snap')");
my $last = sub {
	return sql("SELECT event->'data'->'new' FROM eventgrid.events WHERE topic = 'snap' ORDER BY id DESC LIMIT 1");
};

my $id = 0;
for my $writer_iso ('REPEATABLE READ', 'SERIALIZABLE')
{
	for my $admin_iso ('READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE')
	{
		my $case = "writer $writer_iso, change $admin_iso";
		# a new session: its first look at the publication is inside the old snapshot
		my $w = $node->background_psql('postgres');
		$w->query_safe("BEGIN ISOLATION LEVEL $writer_iso; SELECT count(*) FROM pg_class;");
		sql("BEGIN ISOLATION LEVEL $admin_iso;"
			  . " SELECT eventgrid.publish_table_changes('snap_t', 'snap', columns => ARRAY['id', 'a']); COMMIT;");
		$id++;
		$w->query_safe("INSERT INTO snap_t VALUES ($id, $id, 'secret'); COMMIT;");
		is($last->(), qq({"a": $id, "id": $id}), "$case: the statement in the old snapshot publishes without the removed column");
		$id++;
		$w->query_safe("INSERT INTO snap_t VALUES ($id, $id, 'secret');");
		is($last->(), qq({"a": $id, "id": $id}), "$case: and so does the session's next transaction");
		$id++;
		$w->query_safe("BEGIN ISOLATION LEVEL $writer_iso; SELECT count(*) FROM pg_class;");
		sql("BEGIN ISOLATION LEVEL $admin_iso; SELECT eventgrid.publish_table_changes('snap_t', 'snap'); COMMIT;");
		$w->query_safe("INSERT INTO snap_t VALUES ($id, $id, 'open'); COMMIT;");
		is($last->(), qq({"a": $id, "b": "open", "id": $id}), "$case: a column added back while the session keeps the old row is published");
		$id++;
		$w->query_safe("INSERT INTO snap_t VALUES ($id, $id, 'open');");
		is($last->(), qq({"a": $id, "b": "open", "id": $id}), "$case: and in the next transaction");
		$w->quit;
	}
}

$node->stop;
done_testing();
