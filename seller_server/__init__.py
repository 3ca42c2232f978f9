"""The seller server: listing, pricing and removing items, and the seller's rating."""
