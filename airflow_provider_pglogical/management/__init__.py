"""Publications, published tables, slots, subscriptions and publisher health: SQL only, no Arrow."""
