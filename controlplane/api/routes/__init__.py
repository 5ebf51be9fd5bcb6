"""One ``APIRouter`` per resource; ``create_app`` includes them."""
