"""The PostgreSQL backend: upstream's SQL commands and migrations over psycopg 3.

The only place that imports ``psycopg`` / ``psycopg_pool``, and only when a PostgreSQL connection
is made, so ``import bullmq_compat`` works without them (``pip install 'bullmq-compat[postgres]'``).
"""
