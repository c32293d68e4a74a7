"""The second derivation of each `evals/ecommerce-malloy` golden: SQL on the truth tables.

`tools/derive_malloy_goldens.py` writes these into each case's `golden.verification`
(`secondQuery`, `primaryAxis`, `variesAxis`). Each is written independently of the case's
Malloy `canonicalQuery`: it runs on DuckDB straight over the truth package's parquet files (one
view per truth source: order_items, users, products, inventory_items; see
`pytest_evalloop.targets.malloy.truth`), never through the Malloy compiler, and takes another
route to the same figure (the axis it varies is named). qid → (sql, primaryAxis, variesAxis).
"""

from __future__ import annotations

SALES_2022 = (
    "SELECT sum(month_sales) AS total_sales FROM (\n"
    "  SELECT date_trunc('month', created_at) AS mo, sum(sale_price) AS month_sales\n"
    "  FROM order_items\n"
    "  WHERE created_at >= TIMESTAMP '2022-01-01' AND created_at < TIMESTAMP '2023-01-01'\n"
    "  GROUP BY 1\n)",
    "year() of the line's created_at, one sum",
    "a timestamp range, monthly subtotals summed (SQL on the parquet files)",
)
SECOND = {
    "ecom_2022_sales_bookings": SALES_2022,
    "ecom_2022_sales_casual": SALES_2022,
    "ecom_2022_sales_formal": SALES_2022,
    "ecom_average_order_value": (
        "SELECT sum(sale_price) / count(DISTINCT order_id) AS aov FROM order_items",
        "average of per-order totals",
        "all sales over the number of distinct orders",
    ),
    "ecom_avg_cost_per_item_sold": (
        "SELECT sum(cost) AS total_cost, count(*) AS items_sold,\n"
        "  round(sum(cost) / count(*), 4) AS avg_cost_per_item_sold\n"
        "FROM inventory_items\n"
        "WHERE id IN (SELECT inventory_item_id FROM order_items)",
        "order lines joined to their inventory item",
        "inventory items that some order line references (semi-join from the stock side)",
    ),
    "ecom_avg_selling_price_per_item": (
        "SELECT sum(sale_price) AS total_sales, count(DISTINCT id) AS items_sold,\n"
        "  round(avg(sale_price), 4) AS avg_selling_price_per_item\nFROM order_items",
        "total sales over a count of lines",
        "avg() of the line price, lines counted by distinct id",
    ),
    "ecom_avg_spend_per_customer": (
        "SELECT sum(spent) AS total_sales, count(*) AS customers,\n"
        "  round(avg(spent), 4) AS avg_spend_per_customer\n"
        "FROM (SELECT user_id, sum(sale_price) AS spent FROM order_items GROUP BY user_id)",
        "all sales over distinct buyers",
        "the average of each buyer's own total",
    ),
    "ecom_catalog_retail_value": (
        "SELECT sum(dept_value) AS catalog_retail_value FROM (\n"
        "  SELECT department, sum(retail_price) AS dept_value FROM products GROUP BY department\n)",
        "one sum over the catalogue",
        "per-department subtotals summed",
    ),
    "ecom_cogs_of_sold_items": (
        "SELECT sum(p.cost) AS cogs\n"
        "FROM order_items o\n"
        "JOIN inventory_items i ON i.id = o.inventory_item_id\n"
        "JOIN products p ON p.id = i.product_id",
        "the inventory item's own cost column",
        "the catalogue's cost of the item's product",
    ),
    "ecom_completed_revenue": (
        "SELECT sum(status_sales) FILTER (WHERE status = 'Complete') AS total_sales FROM (\n"
        "  SELECT status, sum(sale_price) AS status_sales FROM order_items GROUP BY status\n)",
        "a where filter on status, one sum",
        "sales grouped by status, the Complete group picked",
    ),
    "ecom_cumulative_4m_crossing_2022": (
        "WITH m AS (\n"
        "  SELECT month(created_at) AS mo, sum(sale_price) AS sales FROM order_items\n"
        "  WHERE created_at >= TIMESTAMP '2022-01-01' GROUP BY 1\n"
        "), c AS (\n"
        "  SELECT a.mo, a.sales, (SELECT sum(b.sales) FROM m b WHERE b.mo <= a.mo) AS cume FROM m a\n"
        ")\n"
        "SELECT mo AS crossing_month, round(cume, 2) AS cume_at_crossing,\n"
        "  round(cume - sales, 2) AS prev_month_cume,\n"
        "  round(4000000 - (cume - sales), 2) AS short_of_4m_prior_month\n"
        "FROM c WHERE cume >= 4000000 ORDER BY mo LIMIT 1",
        "a running-sum window over months",
        "each month's cumulative total by a correlated sum of earlier months",
    ),
    "ecom_customer_count": (
        "SELECT count(*) AS buyers FROM users u\n"
        "WHERE EXISTS (SELECT 1 FROM order_items o WHERE o.user_id = u.id)",
        "distinct user ids on order lines",
        "user accounts with at least one line (from the users table)",
    ),
    "ecom_customer_lifetime_value": (
        "SELECT avg(kept) AS average_lifetime_value FROM (\n"
        "  SELECT user_id, coalesce(sum(sale_price) FILTER\n"
        "    (WHERE status NOT IN ('Cancelled', 'Returned')), 0) AS kept\n"
        "  FROM order_items GROUP BY user_id\n)",
        "kept sales over all distinct buyers",
        "the average of each buyer's kept spend",
    ),
    "ecom_customer_return_rate": (
        "SELECT count(DISTINCT user_id) AS customers,\n"
        "  count(DISTINCT user_id) FILTER (WHERE status = 'Returned') AS customers_with_a_return,\n"
        "  round(count(DISTINCT user_id) FILTER (WHERE status = 'Returned')\n"
        "    / count(DISTINCT user_id), 6) AS customer_return_rate\nFROM order_items",
        "per-buyer return counts, then buyers with one",
        "distinct buyers on returned lines over all distinct buyers",
    ),
    "ecom_delivery_time_trend_2022": (
        "WITH y AS (\n"
        "  SELECT round(avg(delivered_at - created_at::date) FILTER (WHERE created_at >= TIMESTAMP"
        " '2022-01-01'), 3) AS d22,\n"
        "    round(avg(delivered_at - created_at::date) FILTER (WHERE created_at >= TIMESTAMP"
        " '2021-01-01' AND created_at < TIMESTAMP '2022-01-01'), 3) AS d21\n"
        "  FROM order_items WHERE delivered_at IS NOT NULL\n"
        ")\n"
        "SELECT d22 AS avg_days_2022, d21 AS avg_days_2021, round(d22 - d21, 3) AS yoy_change_days"
        " FROM y",
        "per-year averages with lag() to the prior year",
        "two filtered averages over timestamp ranges, days as date subtraction",
    ),
    "ecom_distinct_products_sold": (
        "SELECT count(*) AS products_sold FROM products p\n"
        "WHERE p.id IN (SELECT i.product_id FROM inventory_items i\n"
        "  JOIN order_items o ON o.inventory_item_id = i.id)",
        "distinct product ids over order lines joined to inventory",
        "catalogue products that some sold item belongs to (semi-join from products)",
    ),
    "ecom_gross_margin_pct": (
        "SELECT sum(o.sale_price) AS total_sales, sum(p.cost) AS total_cost,\n"
        "  round(sum(o.sale_price - p.cost) / sum(o.sale_price), 6) AS gross_margin_pct\n"
        "FROM order_items o JOIN inventory_items i ON i.id = o.inventory_item_id\n"
        "JOIN products p ON p.id = i.product_id",
        "sales minus the inventory item's cost, over sales",
        "per-line margin summed, cost from the catalogue's product",
    ),
    "ecom_levis_customers": (
        "SELECT count(DISTINCT o.user_id) AS customers FROM order_items o\n"
        "JOIN inventory_items i ON i.id = o.inventory_item_id\n"
        "JOIN products p ON p.id = i.product_id\n"
        "WHERE p.brand = 'Levi''s'",
        "the inventory item's copied product_brand",
        "the catalogue's brand of the item's product",
    ),
    "ecom_levis_sales": (
        "SELECT sum(sale_price) AS total_sales FROM order_items\n"
        "WHERE inventory_item_id IN (SELECT i.id FROM inventory_items i\n"
        "  JOIN products p ON p.id = i.product_id WHERE p.brand = 'Levi''s')",
        "a join to inventory filtered on product_brand",
        "an IN list of items whose catalogue product is Levi's",
    ),
    "ecom_lifetime_spend": (
        "SELECT sum(sale_price) - coalesce(sum(sale_price) FILTER\n"
        "  (WHERE status IN ('Cancelled', 'Returned')), 0) AS lifetime_spend\nFROM order_items",
        "a where filter keeping the statuses that count",
        "all sales minus the cancelled and returned ones",
    ),
    "ecom_mom_largest_drop_2022": (
        "WITH m AS (\n"
        "  SELECT month(created_at) AS mo, sum(sale_price) AS sales FROM order_items\n"
        "  WHERE created_at >= TIMESTAMP '2022-01-01' GROUP BY 1\n"
        ")\n"
        "SELECT a.mo AS drop_month, a.sales AS month_sales, b.sales AS prev_month_sales,\n"
        "  round(a.sales - b.sales, 2) AS mom_change, round(a.sales / b.sales - 1, 4) AS mom_pct\n"
        "FROM m a JOIN m b ON b.mo = a.mo - 1\n"
        "WHERE a.mo < 11 ORDER BY a.sales / b.sales LIMIT 1",
        "lag() over monthly totals",
        "a self-join of each month to the month before",
    ),
    "ecom_multi_item_order_share": (
        "SELECT count(DISTINCT order_id) AS orders,\n"
        "  count(DISTINCT order_id) FILTER (WHERE EXISTS (SELECT 1 FROM order_items o2\n"
        "    WHERE o2.order_id = o.order_id AND o2.id <> o.id)) AS multi_item_orders,\n"
        "  round(multi_item_orders / orders, 4) AS multi_item_share\n"
        "FROM order_items o",
        "lines counted per order, then orders with more than one",
        "orders having a line with another line of the same order (self semi-join)",
    ),
    "ecom_new_customers_2022": (
        "SELECT count(DISTINCT user_id) AS new_customers FROM order_items\n"
        "WHERE created_at >= TIMESTAMP '2022-01-01' AND created_at < TIMESTAMP '2023-01-01'\n"
        "  AND user_id NOT IN (SELECT user_id FROM order_items\n"
        "    WHERE created_at < TIMESTAMP '2022-01-01')",
        "each buyer's first order date, then its year",
        "2022 buyers with no earlier order (anti-join)",
    ),
    "ecom_open_orders": (
        "SELECT count(*) FILTER (WHERE open_lines > 0) AS open_orders,\n"
        "  sum(open_lines) AS open_line_items,\n"
        "  count(*) FILTER (WHERE undelivered > 0) AS undelivered_including_cancelled\n"
        "FROM (SELECT order_id,\n"
        "    count(*) FILTER (WHERE status IN ('Processing', 'Shipped')) AS open_lines,\n"
        "    count(*) FILTER (WHERE delivered_at IS NULL) AS undelivered\n"
        "  FROM order_items GROUP BY order_id)",
        "filtered distinct counts over lines",
        "lines rolled up per order first, then orders counted",
    ),
    "ecom_order_count": (
        "SELECT count(*) AS order_count FROM order_items o\n"
        "WHERE NOT EXISTS (SELECT 1 FROM order_items p\n"
        "  WHERE p.order_id = o.order_id AND p.id < o.id)",
        "a distinct count of order ids",
        "the first line of each order counted (anti-join on earlier lines)",
    ),
    "ecom_peak_month_per_year": (
        "WITH m AS (\n"
        "  SELECT year(created_at) AS order_year, month(created_at) AS order_month,\n"
        "    sum(sale_price) AS monthly_sales FROM order_items GROUP BY 1, 2\n"
        ")\n"
        "SELECT m.order_year, m.order_month, m.monthly_sales FROM m\n"
        "JOIN (SELECT order_year, max(monthly_sales) AS best FROM m GROUP BY 1) b\n"
        "  ON b.order_year = m.order_year AND b.best = m.monthly_sales",
        "rank() of months within each year",
        "each year's maximum monthly total joined back",
    ),
    "ecom_products_we_sell": (
        "SELECT sum(n) AS catalog_products FROM (\n"
        "  SELECT category, count(DISTINCT id) AS n FROM products GROUP BY category\n)",
        "a distinct count of catalogue ids",
        "per-category distinct counts summed",
    ),
    "ecom_profit": (
        "SELECT sum(o.sale_price - p.cost) AS total_gross_margin\n"
        "FROM order_items o JOIN inventory_items i ON i.id = o.inventory_item_id\n"
        "JOIN products p ON p.id = i.product_id",
        "total sales minus the inventory items' total cost",
        "per-line margin summed, cost from the catalogue's product",
    ),
    "ecom_repeat_customer_rate": (
        "SELECT count(*) AS buyers,\n"
        "  count(*) FILTER (WHERE first_order <> last_order) AS repeat_customers,\n"
        "  round(repeat_customers / buyers, 4) AS repeat_rate\n"
        "FROM (SELECT user_id, min(order_id) AS first_order, max(order_id) AS last_order\n"
        "  FROM order_items GROUP BY user_id)",
        "distinct orders counted per buyer",
        "buyers whose lowest and highest order ids differ",
    ),
    "ecom_return_lag_after_delivery": (
        "SELECT count(*) FILTER (WHERE status = 'Returned') AS returned_items,\n"
        "  count(*) FILTER (WHERE status = 'Returned' AND returned_at = created_at)\n"
        "    AS returned_at_equals_created_at,\n"
        "  round(avg(returned_at::date - delivered_at) FILTER (WHERE status = 'Returned'), 4)\n"
        "    AS naive_days_delivered_to_returned\nFROM order_items",
        "a where filter on Returned, days() between the dates",
        "filtered aggregates over all lines, days as date subtraction",
    ),
    "ecom_return_rate": (
        "SELECT avg(CASE WHEN status = 'Returned' THEN 1.0 ELSE 0.0 END) AS item_return_rate"
        " FROM order_items",
        "returned lines counted over all lines",
        "the average of a 0/1 returned flag",
    ),
    "ecom_return_share_of_delivered": (
        "SELECT sum(n) FILTER (WHERE status = 'Returned') AS returned_items,\n"
        "  sum(n) FILTER (WHERE status IN ('Complete', 'Returned')) AS delivered_items,\n"
        "  round(returned_items / delivered_items, 6) AS return_share_of_delivered\n"
        "FROM (SELECT status, count(*) AS n FROM order_items GROUP BY status)",
        "delivered lines by delivered_at not null",
        "delivered lines by status (Complete or Returned), counts per status",
    ),
    "ecom_returned_orders_count": (
        "WITH r AS (SELECT DISTINCT order_id FROM order_items WHERE status = 'Returned'),\n"
        "  n AS (SELECT DISTINCT order_id FROM order_items WHERE status <> 'Returned')\n"
        "SELECT (SELECT count(*) FROM r) AS returned_orders,\n"
        "  (SELECT count(*) FROM r WHERE order_id NOT IN (SELECT order_id FROM n))"
        " AS fully_returned_orders,\n"
        "  (SELECT count(*) FROM r WHERE order_id IN (SELECT order_id FROM n))"
        " AS partially_returned_orders",
        "returned lines counted per order",
        "sets of orders with a returned line and with a kept line, intersected",
    ),
    "ecom_revenue_by_channel": (
        "SELECT u.traffic_source AS channel, round(sum(s.spent), 2) AS revenue\n"
        "FROM (SELECT user_id, sum(sale_price) AS spent FROM order_items GROUP BY user_id) s\n"
        "JOIN users u ON u.id = s.user_id GROUP BY 1",
        "lines joined to their buyer, summed per traffic source",
        "per-buyer totals first, then summed per traffic source",
    ),
    "ecom_shipped_item_share": (
        "SELECT count(*) FILTER (WHERE status IN ('Shipped', 'Complete', 'Returned'))"
        " AS shipped_items,\n"
        "  count(*) AS total_items, round(shipped_items / total_items, 6) AS shipped_share\n"
        "FROM order_items",
        "shipped lines by shipped_at not null",
        "shipped lines by status (Shipped, Complete or Returned)",
    ),
    "ecom_time_to_ship": (
        "SELECT count(*) AS shipped_lines,\n"
        "  round(avg(shipped_at - created_at::date), 4) AS avg_days_to_ship\n"
        "FROM order_items WHERE status IN ('Shipped', 'Complete', 'Returned')",
        "shipped_at not null, day() between the dates",
        "shipped statuses, days as date subtraction",
    ),
    "ecom_top_customer_count": (
        "SELECT count(*) AS top_customers FROM (\n"
        "  SELECT user_id FROM (SELECT DISTINCT user_id, order_id FROM order_items)\n"
        "  GROUP BY user_id HAVING count(*) > 10\n)",
        "a distinct count of orders per buyer",
        "distinct (buyer, order) pairs first, then counted per buyer",
    ),
    "ecom_units_sold_2022": (
        "SELECT sum(n) - coalesce(sum(n) FILTER (WHERE status = 'Cancelled'), 0) AS units_sold,\n"
        "  sum(n) AS all_2022_lines,\n"
        "  sum(n) FILTER (WHERE status = 'Cancelled') AS cancelled_2022_lines\n"
        "FROM (SELECT status, count(*) AS n FROM order_items\n"
        "  WHERE created_at >= TIMESTAMP '2022-01-01' AND created_at < TIMESTAMP '2023-01-01'\n"
        "  GROUP BY status)",
        "year() filter, filtered counts over lines",
        "a timestamp range, counts per status, units as all minus cancelled",
    ),
    "ecom_yoy": (
        "WITH y AS (\n"
        "  SELECT year(created_at) AS yr, sum(sale_price) AS sales,\n"
        "    sum(sale_price) FILTER (WHERE dayofyear(created_at) <= dayofyear(DATE '2021-11-14'))"
        " AS ytd\n"
        "  FROM order_items GROUP BY 1\n"
        ")\n"
        "SELECT a.sales AS sales_2021, b.sales AS sales_2022, a.ytd AS ytd_2021_to_nov14,\n"
        "  strftime((SELECT max(created_at) FROM order_items)::date, '%Y-%m-%dT00:00:00.000Z')"
        " AS window_end,\n"
        "  round(b.sales / a.sales - 1, 4) AS naive_yoy,\n"
        "  round(b.sales / a.ytd - 1, 4) AS comparable_yoy\n"
        "FROM y a JOIN y b ON a.yr = 2021 AND b.yr = 2022",
        "filtered sums over timestamp ranges",
        "sums grouped per year, the year-to-date window by day of year",
    ),
}
