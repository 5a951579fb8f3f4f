-- Demo: an application table whose changes are published as events.
-- shop_orders publishes to topic shop-orders: its rows' region, id, status
-- and amount (never the card column), and an UPDATE only when status
-- changed; the shipping subscription takes the orders that became paid.
-- :receiver is the receiver's base URL.
SELECT eventgrid.create_topic('shop-orders');
SELECT eventgrid.create_event_subscription('shop-orders', 'shipping', :'receiver' || '/status/200/shipping',
       included_event_types => ARRAY['public.shop_orders.Updated'],
       advanced_filters => '[{"operatorType": "StringIn", "key": "data.new.status", "values": ["paid"]}]');
CREATE TABLE shop_orders (region text, id int, status text, amount numeric, card text, PRIMARY KEY (region, id));
SELECT eventgrid.publish_table_changes('shop_orders', 'shop-orders',
       columns => ARRAY['region', 'id', 'status', 'amount'], update_columns => ARRAY['status']);
-- the application's own statements: no INSERT INTO eventgrid.events anywhere
INSERT INTO shop_orders VALUES ('eu/west', 7, 'new', 25.00, '4111-1111'), ('us', 8, 'new', 9.90, '5500-0000');
UPDATE shop_orders SET amount = 26.00 WHERE id = 7;   -- status unchanged: publishes nothing
UPDATE shop_orders SET status = 'paid' WHERE id = 7;  -- the one event shipping receives
